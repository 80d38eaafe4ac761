"""ResNet-50 v1.5's bare step (workloads/common/jax_bare_step.py): 224x224x3 images, 1000
classes, SGD with momentum."""
from workloads.common.jax_bare_step import Anchor, classifier

GPU_BATCH = 256
ANCHOR = Anchor(0.19, 0.192, "MLPerf v4.0 8x H200, MXNet + DALI, ~7,960 img/s a GPU "
                             "(H100 ~7,160)")


def build(batch, dtype, rng, shapes):
  from workloads.resnet import jax_model, spec  # pylint: disable=import-outside-toplevel
  cfg = spec.SPEC.configure(*shapes)
  return classifier(spec, cfg, jax_model.build(cfg, dtype), batch, rng, "", dropout=False)
