"""Progress lines inside long eval blocks, and --tensorboard event files (written through
tensorboardX, without TensorFlow; read back here with TensorFlow's own TFRecord reader and Event
proto)."""
import os
import struct
import time

import pytest

from harness import cli, tensorboard
from tests.harness.test_driver import ScriptedTrainer, _run
from workloads.resnet import spec


def _events(path):
  import tensorflow as tf
  from tensorflow.core.util import event_pb2
  return [event_pb2.Event.FromString(raw.numpy()) for raw in tf.data.TFRecordDataset(path)]


def test_a_multi_epoch_block_prints_a_line_per_epoch(tmp_path, capsys):
  cfg = spec.mini()
  cfg.train.eval_every_epochs = 3                 # blocks of 3 epochs, 10 steps each
  _run(tmp_path, ScriptedTrainer([0.5, 0.95]), cfg)
  lines = [l for l in capsys.readouterr().out.splitlines() if "  step " in l]
  assert [l.split("  step ")[1].split(" (")[0] for l in lines] == ["10", "20", "40", "50"]
  assert "(epoch 1.00, block 10/30)" in lines[0] and "samples/s | loss 1.0000 | lr 0.1" in lines[0]


def test_tensorboard_scalars_per_chunk_and_block(tmp_path):
  cfg = spec.mini()
  cfg.train.eval_every_epochs = 2
  trainer = ScriptedTrainer([0.5, 0.95], losses=[3.0, 2.0, 1.5, 1.0])
  from harness import driver
  cfg.train.global_batch_size = 64
  opts = driver.RunOptions(framework="jax", preset="mini", seed=1, tensorboard=str(tmp_path / "tb"),
                           results_path=str(tmp_path / "r.csv"), log_dir=str(tmp_path / "logs"))
  row = driver.run_all(spec.SPEC, cfg, opts, lambda seed: trainer)[0]
  files = os.listdir(tmp_path / "tb" / row.run_id)
  assert len(files) == 1 and files[0].startswith("events.out.tfevents.")
  events = _events(str(tmp_path / "tb" / row.run_id / files[0]))
  assert events[0].file_version == "brain.Event:2"
  scalars = {(e.step, v.tag): v.simple_value for e in events[1:] for v in e.summary.value}
  assert scalars[(10, "train/loss")] == 3.0 and scalars[(30, "train/loss")] == 1.5
  assert scalars[(20, "train/loss")] == 2.0 and scalars[(40, "train/loss")] == 1.0
  assert scalars[(20, "eval/top1_accuracy")] == 0.5
  assert scalars[(40, "eval/top1_accuracy")] == 0.949999988079071      # float32
  assert scalars[(40, "train/lr")] == pytest.approx(0.1)
  assert scalars[(40, "train/samples_per_s")] == pytest.approx(row.throughput, rel=1e-6)


def test_scalars_are_readable_while_the_run_trains_and_none_is_left_out(tmp_path):
  """tensorboardX's writer thread flushes within FLUSH_SECS: TensorBoard sees a chunk's
  scalars before the run closes its writer; a None value (no lr this chunk) is no point."""
  writer = tensorboard.ScalarWriter(str(tmp_path))
  writer.scalars(7, {"train/loss": 2.5, "train/lr": None})
  deadline = time.time() + 10 * tensorboard.FLUSH_SECS + 5
  while len(_events(writer.path)) < 2 and time.time() < deadline:
    time.sleep(0.2)
  events = _events(writer.path)
  writer.close()
  assert events[0].file_version == "brain.Event:2"
  assert [(e.step, v.tag, v.simple_value) for e in events[1:] for v in e.summary.value] == [
      (7, "train/loss", 2.5)]
  assert os.listdir(tmp_path) == [os.path.basename(writer.path)]


def test_two_writers_in_one_folder_write_two_files(tmp_path):
  """Each writer has its own file even when both start in the same second."""
  first, second = (tensorboard.ScalarWriter(str(tmp_path)) for _ in range(2))
  first.scalars(1, {"a": 1.0})
  second.scalars(1, {"a": 2.0})
  first.close()
  second.close()
  assert first.path != second.path and len(os.listdir(tmp_path)) == 2
  assert [v.simple_value for e in _events(second.path)[1:] for v in e.summary.value] == [2.0]


def test_a_corrupted_record_is_refused_by_the_reader(tmp_path):
  """The checksums are real: TensorFlow's reader rejects a flipped byte."""
  writer = tensorboard.ScalarWriter(str(tmp_path))
  writer.scalars(1, {"loss": 1.0})
  writer.close()
  data = bytearray(open(writer.path, "rb").read())
  assert len(_events(writer.path)) == 2
  first = struct.unpack("<Q", data[:8])[0]
  data[12 + first + 4 + 8 + 12 + 3] ^= 0xFF       # a byte inside the second record's data
  open(writer.path, "wb").write(bytes(data))
  with pytest.raises(Exception, match="(?i)corrupt|data ?loss|checksum|crc"):
    _events(writer.path)


def test_tensorboard_path_that_is_a_file(tmp_path, capsys):
  (tmp_path / "f").write_text("")
  assert cli.main(["run", "resnet50", "--tensorboard", str(tmp_path / "f"),
                   "--results", str(tmp_path / "r.csv")]) == 2
  assert "is a file" in capsys.readouterr().err and not (tmp_path / "r.csv").exists()
