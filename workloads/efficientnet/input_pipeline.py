"""EfficientNet's input: the shared ImageNet pipeline (workloads/common/imagenet.py) with the
tensorflow/tpu EfficientNet preprocessing (imagenet.EFFICIENTNET: inception crop, bicubic
resize to the variant's resolution, flip; eval: central size/(size+32) crop, 0.875 at 224, bicubic resize), behind
the entry points the base trainers call (see resnet/input_pipeline.py)."""
from workloads.common import imagenet


def data_source(cfg, ctx):
  return ctx.data_dir, cfg.data.train_examples


def train_dataset(cfg, global_batch_size, seed, data_dir=None, process_index=0, process_count=1):
  return imagenet.train_dataset(cfg.data, cfg.model.num_classes, global_batch_size, seed,
                                data_dir, process_index, process_count, imagenet.EFFICIENTNET)


def eval_dataset(cfg, global_batch_size, data_dir=None, process_index=0, process_count=1):
  return imagenet.eval_dataset(cfg.data, cfg.model.num_classes, global_batch_size, data_dir,
                               process_index, process_count, imagenet.EFFICIENTNET)


def synthetic_batch(cfg, batch_size, seed):
  return imagenet.synthetic_batch(cfg.data, cfg.model.num_classes, batch_size, seed)
