"""ResNet's input: the shared ImageNet pipeline (workloads/common/imagenet.py), behind the
entry points every workload's input_pipeline.py offers the base trainers (the InputPipeline
protocol of harness/workload.py, reached as spec.SPEC.input_pipeline)."""
from workloads.common import imagenet


def data_source(cfg, ctx):
  return ctx.data_dir, cfg.data.train_examples


def train_dataset(cfg, global_batch_size, seed, data_dir=None, process_index=0, process_count=1):
  return imagenet.train_dataset(cfg.data, cfg.model.num_classes, global_batch_size, seed,
                                data_dir, process_index, process_count)


def eval_dataset(cfg, global_batch_size, data_dir=None, process_index=0, process_count=1):
  return imagenet.eval_dataset(cfg.data, cfg.model.num_classes, global_batch_size, data_dir,
                               process_index, process_count)


def synthetic_batch(cfg, batch_size, seed):
  return imagenet.synthetic_batch(cfg.data, cfg.model.num_classes, batch_size, seed)
