"""Corrupt data files: a generated mini set notices (sizes and checksums in its info.json) and
generates itself again; any other TFRecord file that tf.data fails on is named, with the
reason, in the one line the command line prints (tf.data's error names no file)."""
import json
import os

import tensorflow as tf

from harness import errors
from workloads.common import mini_cache, records


def _write_records(path, n=200):
  with tf.io.TFRecordWriter(str(path)) as w:
    for i in range(n):
      w.write(bytes([i % 251]) * 100)


def _overwrite(path, offset=2000, count=400):
  data = bytearray(path.read_bytes())
  data[offset:offset + count] = b"\0" * count
  path.write_bytes(bytes(data))


def test_a_corrupt_file_is_named_with_tf_data_s_reason(tmp_path):
  good, bad = tmp_path / "train-00000", tmp_path / "train-00001"
  _write_records(good), _write_records(bad)
  _overwrite(bad)
  assert records.first_corrupt([str(good)]) is None
  path, reason = records.first_corrupt([str(good), str(bad)])
  assert path == str(bad) and "corrupted record" in reason
  records.noted([str(good), str(bad)])
  try:
    for _ in tf.data.TFRecordDataset([str(good), str(bad)]):
      pass
  except tf.errors.DataLossError as e:
    line = records.explain(e)
    assert errors.explained(e) == line       # what the command line and the driver ask
  assert f"data file '{bad}' is corrupt (" in line and "\n" not in line
  assert errors.explained(ValueError("other")) is None


def test_a_damaged_mini_set_is_generated_again(tmp_path):
  calls = []

  def write(folder):
    calls.append(folder)
    _write_records(os.path.join(folder, "train-00000"))
    return {"examples": 200}

  folder, info = mini_cache.prepare(str(tmp_path), {"n": 200}, write)
  assert info == {"examples": 200} and len(calls) == 1
  listed = json.load(open(os.path.join(folder, "info.json")))[mini_cache.FILES]
  assert list(listed) == ["train-00000"] and listed["train-00000"][0] > 0
  assert mini_cache.prepare(str(tmp_path), {"n": 200}, write)[0] == folder and len(calls) == 1
  _overwrite(tmp_path / os.path.basename(folder) / "train-00000")     # same size, other bytes
  again, info = mini_cache.prepare(str(tmp_path), {"n": 200}, write)
  assert again == folder and len(calls) == 2 and info == {"examples": 200}
  assert records.first_corrupt([os.path.join(folder, "train-00000")]) is None
  assert sorted(os.listdir(tmp_path)) == [os.path.basename(folder)]   # nothing left aside
