"""The cache of generated mini datasets: a folder per (workload, hash of the generator's
config), written whole in a staging folder and renamed into place, so a reader never sees a
half-written set and two processes preparing the same set at once are both safe."""
import hashlib
import json
import os
import shutil
import tempfile


def default_root(workload):
  return os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                      "mlperf-tf-jax", f"{workload}_mini")


def key(fields: dict) -> str:
  """16 hex digits of a hash of the generator's settings (JSON, sorted keys)."""
  return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def prepare(root, fields: dict, write) -> tuple[str, dict]:
  """(folder, info) of the set keyed by `fields` under `root`; `write(staging_dir) -> info`
  (a JSON-able dict) generates it the first time."""
  folder = os.path.join(root, key(fields))
  info_path = os.path.join(folder, "info.json")
  if not os.path.exists(info_path):
    os.makedirs(root, exist_ok=True)
    staging = tempfile.mkdtemp(dir=root)
    try:
      info = write(staging)
      with open(os.path.join(staging, "info.json"), "w") as f:
        json.dump(info, f)
    except BaseException:
      shutil.rmtree(staging, ignore_errors=True)
      raise
    try:
      os.rename(staging, folder)
    except OSError:                      # another process renamed its copy first
      shutil.rmtree(staging, ignore_errors=True)
  with open(info_path) as f:
    return folder, json.load(f)
