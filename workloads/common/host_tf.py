"""TensorFlow and tensorflow-datasets for the host's input pipelines, imported on first use.

A JAX run on an accelerator image without TensorFlow (a synthetic run: its batches are made in
numpy) must not import it: the pipelines name `tf` and `tfds` through these proxies, which
import the real module at their first attribute access, i.e. when a pipeline that reads files
(or writes a mini set) runs. In a JAX run TensorFlow only feeds the host, so once it loads it
is kept off every GPU (`keep_off_accelerators`, called by the JAX trainer base) and JAX keeps
all of their memory. A TF run imports TensorFlow itself and is not touched.
"""
import importlib
import sys
import types

_JAX_HOST = False


def _hide_accelerators(tf):
  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:          # TensorFlow already initialised its devices: nothing to hide
    pass


def keep_off_accelerators():
  """From now on TensorFlow, whenever it loads through these proxies, sees no GPU."""
  global _JAX_HOST
  _JAX_HOST = True
  if sys.modules.get("tensorflow") is not None:
    _hide_accelerators(sys.modules["tensorflow"])


class _LazyModule(types.ModuleType):
  """A module that imports `name` at its first attribute access."""

  def __getattr__(self, attr):
    if attr.startswith("__"):
      raise AttributeError(attr)
    module = importlib.import_module(self.__name__)
    if self.__name__ == "tensorflow" and _JAX_HOST and not self.__dict__.get("hidden"):
      self.__dict__["hidden"] = True       # (an attribute lookup here would recurse)
      _hide_accelerators(module)
    return getattr(module, attr)


tf = _LazyModule("tensorflow")
tfds = _LazyModule("tensorflow_datasets")
