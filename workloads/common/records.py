"""Which TFRecord files a run reads, and which one is corrupt when tf.data stops with a
DataLossError (its message says "corrupted record at <offset>" and names no file).

Every reader notes its files here when it builds its dataset (`noted`, `noted_tfds`); on a
DataLossError the command line asks `explain`, which reads the noted files one by one (only
then: the cost is on the error path) and names the first that fails, with tf.data's reason."""
import glob
import os
import sys

from workloads.common.host_tf import tf

from harness import errors

_FILES = []


def noted(files):
  """Returns `files`, remembered as read by this run."""
  for path in files:
    path = os.fspath(path)
    if path not in _FILES:
      _FILES.append(path)
  return files


def noted_tfds(builder):
  """A tensorflow-datasets builder's record files (all splits), remembered; returns it."""
  noted(sorted(glob.glob(os.path.join(builder.data_dir, "*.tfrecord*"))))
  return builder


def first_corrupt(files=None):
  """(path, tf.data's reason) of the first file that cannot be read whole, else None."""
  for path in files if files is not None else list(_FILES):
    try:
      for _ in tf.data.TFRecordDataset(path):
        pass
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
      reason = (e.message or str(e)).split("{{", 1)[0].strip() or str(e).split("}}")[-1]
      return path, " ".join(reason.replace("[Op:IteratorGetNext]", "").split())
  return None


@errors.register_explainer
def explain(error) -> str | None:
  """One line for a DataLossError of a run: the corrupt file and why, or what is known."""
  if sys.modules.get("tensorflow") is None:      # no pipeline read a record: not ours
    return None
  if not isinstance(error, tf.errors.DataLossError):
    return None
  found = first_corrupt()
  if found:
    path, reason = found
    return (f"data file {path!r} is corrupt ({reason}); allowed: an intact copy (a generated "
            "mini set rebuilds itself when its checksums fail: delete it to force that)")
  reason = " ".join(str(error).split("}}")[-1].replace("[Op:IteratorGetNext]", "").split())
  return (f"a data file is corrupt ({reason}) and none of the {len(_FILES)} record files this "
          "run noted fails a full read; allowed: intact data files")
