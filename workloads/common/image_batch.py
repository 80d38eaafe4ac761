"""What every image classifier (ResNet-50, EfficientNet) shares in its spec, framework-neutral:
the batch it trains on (`batch_layout`, which both frameworks turn into their own tensor specs)
and the ImageNet folder it reads (`missing_data`, `DATA_DIR_CONTENTS`)."""
import os

DATA_DIR_CONTENTS = ("a tensorflow-datasets data dir holding a prepared imagenet2012/ (tfds build "
                     "imagenet2012 --data_dir DIR, ILSVRC2012 tars in DIR/downloads/manual)")


def batch_layout(cfg, batch_size: int, with_mask: bool = False) -> dict:
  """{name: (shape, dtype, logical axes)}: square RGB images and integer labels (NHWC); eval
  batches add 'mask' (1 for a real example, 0 for padding)."""
  size = cfg.data.image_size
  layout = {"image": ((batch_size, size, size, 3), "float32",
                      ("batch", "height", "width", "channels")),
            "label": ((batch_size,), "int32", ("batch",))}
  if with_mask:
    layout["mask"] = ((batch_size,), "float32", ("batch",))
  return layout


def missing_data(cfg, data_dir) -> list[str]:
  """tensorflow-datasets keeps a prepared dataset in <data_dir>/<name>/<version>/."""
  if cfg.data.source != "imagenet2012":
    return []
  return [] if os.path.isdir(os.path.join(data_dir, "imagenet2012")) else ["imagenet2012/"]
