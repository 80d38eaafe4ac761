"""The cache of generated mini datasets: a folder per (workload, hash of the generator's
config), written whole in a staging folder and renamed into place, so a reader never sees a
half-written set and two processes preparing the same set at once are both safe. Its
info.json lists every file's size and sha256 ("_files"); a set whose files do not match
(a disk error, an edit) is moved aside and generated again. Checksums are read for sets up to
CHECKSUM_BYTES (the generated mini sets: a few MB, milliseconds); a larger set (a tfds-derived
cache) has its sizes checked, and a corrupt record there is named when tf.data meets it
(records.explain)."""
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


FILES = "_files"
CHECKSUM_BYTES = 256 << 20


def manifest(folder) -> dict:
  """{relative path: [size, sha256]} of every file in `folder` but info.json."""
  out = {}
  for top, _, names in os.walk(folder):
    for name in sorted(names):
      path = os.path.join(top, name)
      rel = os.path.relpath(path, folder)
      if rel == "info.json":
        continue
      digest = hashlib.sha256()
      with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
          digest.update(block)
      out[rel] = [os.path.getsize(path), digest.hexdigest()]
  return out


def intact(folder, info) -> bool:
  """Whether the set's files are the ones its info.json lists (sizes first: cheap)."""
  listed = info.get(FILES)
  if not listed:
    return False
  for rel, (size, _) in listed.items():
    path = os.path.join(folder, rel)
    if not os.path.isfile(path) or os.path.getsize(path) != size:
      return False
  if sum(size for size, _ in listed.values()) > CHECKSUM_BYTES:
    return True
  return manifest(folder) == listed


def prepare(root, fields: dict, write) -> tuple[str, dict]:
  """(folder, info) of the set keyed by `fields` under `root`; `write(staging_dir) -> info`
  (a JSON-able dict) generates it the first time, and again when its files fail their
  checksums."""
  folder = os.path.join(root, key(fields))
  info_path = os.path.join(folder, "info.json")
  if os.path.exists(info_path):
    with open(info_path) as f:
      info = json.load(f)
    if intact(folder, info):
      return folder, {k: v for k, v in info.items() if k != FILES}
    aside = f"{folder}.damaged-{os.getpid()}"
    try:
      os.rename(folder, aside)            # readers of the old set keep their open files
      shutil.rmtree(aside, ignore_errors=True)
    except OSError:                        # another process moved it first
      pass
  if not os.path.exists(info_path):
    os.makedirs(root, exist_ok=True)
    staging = tempfile.mkdtemp(dir=root)
    try:
      info = write(staging)
      info = {**info, FILES: manifest(staging)}
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
    return folder, {k: v for k, v in json.load(f).items() if k != FILES}
