"""EfficientNet's bare step (workloads/common/jax_bare_step.py): B0 at 224x224x3, 1000 classes,
SGD with momentum in place of the recipe's RMSProp, no weight average."""
from workloads.common.jax_bare_step import Anchor, classifier

GPU_BATCH = 128
ANCHOR = Anchor(0.03, 0.029, "DeepLearningExamples EfficientNet-B0, TF2 + XLA, A100")


def build(batch, dtype, rng, shapes):
  from workloads.efficientnet import jax_model, spec  # pylint: disable=import-outside-toplevel
  cfg = spec.SPEC.configure(*shapes)
  return classifier(spec, cfg, jax_model.build(cfg, dtype), batch, rng,
                    f"{cfg.model.variant}: ", dropout=True)
