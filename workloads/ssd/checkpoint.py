"""The ImageNet-pretrained ResNet-34 backbone the reference starts from (torchvision's
resnet34-333f7ec4.pth), read from a numpy archive of its state dict, into either model.

Format: an .npz whose keys are torchvision's state-dict names and whose arrays are the tensors
(`conv1.weight` OIHW, `bn1.weight` / `bn1.bias` / `bn1.running_mean` / `bn1.running_var`,
`layer1.0.conv1.weight`, ..., `layer2.0.downsample.0.weight`, `layer2.0.downsample.1.*`).
Made once, where torch is installed:

    python -c "import numpy, torch; numpy.savez('resnet34-333f7ec4.npz', **{k: v.numpy()
               for k, v in torch.load('resnet34-333f7ec4.pth').items()})"

Only the layers the SSD backbone has are read (layer4 and fc are ignored); every one of them
must be present with the model's shape, else a one-line error names the key.
"""
import os

import numpy as np


def read(data_dir, name) -> dict:
  path = os.path.join(data_dir or "", name)
  if not os.path.exists(path):
    raise FileNotFoundError(f"model.backbone_checkpoint={name!r}: no file {path}")
  with np.load(path) as archive:
    return {k: archive[k] for k in archive.files}


def torch_name(flax_path: tuple) -> str:
  """('layer2_0', 'downsample_conv') -> 'layer2.0.downsample.0'; ('bn1',) -> 'bn1'."""
  if len(flax_path) == 1:
    return flax_path[0]
  layer, block = flax_path[0].split("_")
  sub = {"downsample_conv": "downsample.0", "downsample_bn": "downsample.1"}.get(
      flax_path[1], flax_path[1])
  return f"{layer}.{block}.{sub}"


def is_backbone(flax_path: tuple) -> bool:
  return flax_path[0] in ("conv1", "bn1") or flax_path[0].startswith("layer")


def _get(weights, key, shape):
  if key not in weights:
    raise ValueError(f"backbone checkpoint has no {key!r}: it is not a torchvision ResNet of "
                     "this model's depth")
  value = np.asarray(weights[key])
  if value.shape != tuple(shape):
    raise ValueError(f"backbone checkpoint {key!r} has shape {value.shape}, the model "
                     f"{tuple(shape)}: model.backbone_width/backbone_blocks differ from it")
  return value


def conv_kernel(weights, key, hwio_shape):
  """torch OIHW -> HWIO, the layout of flax and Keras kernels."""
  o, i, h, w = hwio_shape[3], hwio_shape[2], hwio_shape[0], hwio_shape[1]
  return _get(weights, key + ".weight", (o, i, h, w)).transpose(2, 3, 1, 0)


def batch_norm(weights, key, channels):
  """(scale, bias, mean, var) of a torch BatchNorm2d."""
  return tuple(_get(weights, f"{key}.{n}", (channels,))
               for n in ("weight", "bias", "running_mean", "running_var"))


def load_into_flax(variables, weights):
  """A copy of flax {'params', 'batch_stats'} with every backbone layer from the checkpoint."""
  params = _copy(variables["params"])
  stats = _copy(variables["batch_stats"])
  for path, p in _modules(params):
    if not is_backbone(path):
      continue
    key = torch_name(path)
    if "kernel" in p:
      p["kernel"] = conv_kernel(weights, key, p["kernel"].shape).astype(p["kernel"].dtype)
    else:
      s = _at(stats, path)
      dtype = p["scale"].dtype
      p["scale"], p["bias"], s["mean"], s["var"] = (
          v.astype(dtype) for v in batch_norm(weights, key, p["scale"].shape[0]))
  return {"params": params, "batch_stats": stats}


def load_into_keras(model, weights):
  """Sets every backbone layer of the Keras model (tf_model.ssd) from the checkpoint."""
  from keras import layers                 # keras only where the TF model is used
  from workloads.parallel.tf_layers import MODULE_SEPARATOR
  for layer in model.layers:
    path = tuple(layer.name.split(MODULE_SEPARATOR))    # a layer is named by its flax path
    if not layer.weights or not is_backbone(path):
      continue
    key = torch_name(path)
    if isinstance(layer, layers.BatchNormalization):
      layer.set_weights(list(batch_norm(weights, key, layer.gamma.shape[0])))
    else:
      layer.set_weights([conv_kernel(weights, key, layer.kernel.shape)])
  return model


def _copy(tree):
  return {k: _copy(v) if isinstance(v, dict) else np.asarray(v) for k, v in tree.items()}


def _at(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def _modules(tree, prefix=()):
  """(path, leaf dict) of every module that owns arrays."""
  leaves = {k: v for k, v in tree.items() if not isinstance(v, dict)}
  if leaves:
    yield prefix, tree
  for k, v in tree.items():
    if isinstance(v, dict):
      yield from _modules(v, prefix + (k,))
