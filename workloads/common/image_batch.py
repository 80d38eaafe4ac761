"""The batch every image classifier (ResNet-50, EfficientNet) trains on, framework-neutral: the
spec's `batch_layout`, which both frameworks turn into their own tensor specs."""


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
