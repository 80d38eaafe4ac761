import csv
import multiprocessing
import os

import pytest

from harness import results
from harness.errors import UsageError


def make_row(i=0, **changes):
  row = dict(run_id=f"run{i}", started_at="2026-01-01T00:00:00+00:00", system="box",
             workload="resnet50", mlperf_benchmark="resnet", framework="jax", preset="mini",
             status="success", abort_reason="", time_to_train_s=60.0 + i, init_s=1.0,
             epochs_to_converge=3.0, samples_to_converge=100, final_metric=0.9,
             metric_name="top1_accuracy", target=0.9, global_batch_size=64, num_devices=1,
             device_kind="cpu", mesh="data=1", seed=i, throughput=1000.0, mfu=None, host="box",
             git_commit="abc", versions="python=3.11", log_path="logs/x.log, with comma")
  row.update(changes)
  return results.ResultRow(**row)


def _append_many(path, start, count):
  for i in range(start, start + count):
    results.append_row(path, make_row(i))


def test_concurrent_appends_lose_nothing(tmp_path):
  path = str(tmp_path / "r.csv")
  spawn = multiprocessing.get_context("spawn")       # no fork of a process that loaded JAX
  procs = [spawn.Process(target=_append_many, args=(path, k * 100, 60))
           for k in range(3)]
  for p in procs:
    p.start()
  for p in procs:
    p.join()
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 180
  assert sorted(r["run_id"] for r in rows) == sorted(f"run{k * 100 + i}" for k in range(3)
                                                      for i in range(60))
  assert all(r["log_path"] == "logs/x.log, with comma" for r in rows)


def test_a_row_is_one_write_call(tmp_path, monkeypatch):
  """A killed process leaves a whole line or none: header and row go out in a single write."""
  path = str(tmp_path / "r.csv")
  writes = []
  real_write = os.write
  monkeypatch.setattr(os, "write", lambda fd, data: writes.append(data) or real_write(fd, data))
  results.append_row(path, make_row(0))
  results.append_row(path, make_row(1))
  assert len(writes) == 2 and writes[0].count(b"\n") == 2 and writes[1].count(b"\n") == 1
  frame = results.read_csv(path)
  assert list(frame.columns) == results.COLUMNS and len(frame) == 2


def test_check_writable_refuses_foreign_csv_and_directories(tmp_path):
  foreign = tmp_path / "other.csv"
  foreign.write_text("a,b\n1,2\n")
  with pytest.raises(UsageError, match="other columns"):
    results.check_writable(str(foreign))
  with pytest.raises(UsageError, match="is a directory"):
    results.check_writable(str(tmp_path))
  results.check_writable(str(tmp_path / "new" / "deeper.csv"))      # created now, empty
  assert (tmp_path / "new" / "deeper.csv").read_text() == ""
  assert foreign.read_text() == "a,b\n1,2\n"
  with pytest.raises(UsageError, match="cannot be written"):        # even as root
    results.check_writable("/proc/cannot/write.csv")


def test_an_older_csv_is_upgraded_appended_and_read(tmp_path, capsys):
  """A CSV of an older version (no system, mlperf_benchmark, mfu; another order) keeps its rows,
  gets the new columns, takes new rows and still reads with system and benchmark filled in."""
  old_columns = [c for c in results.COLUMNS if c not in ("system", "mlperf_benchmark", "mfu")]
  old_columns = old_columns[::-1]
  path = tmp_path / "old.csv"
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, old_columns)
    writer.writeheader()
    for i in range(2):
      row = vars(make_row(i))
      writer.writerow({c: row[c] for c in old_columns})
  results.check_writable(str(path))
  assert "added the columns" in capsys.readouterr().out
  results.append_row(str(path), make_row(7, system="new-box"))
  frame = results.read_csv(str(path))
  assert len(frame) == 3 and list(frame["run_id"]) == ["run0", "run1", "run7"]
  assert list(frame["system"].fillna("")) == ["", "", "new-box"]
  assert list(frame["mlperf_benchmark"].fillna("")) == ["", "", "resnet"]
  assert list(frame["log_path"]) == ["logs/x.log, with comma"] * 3
  results.check_writable(str(path))                                  # now current: no change
  assert capsys.readouterr().out == ""


def test_an_older_csv_reads_without_upgrade(tmp_path):
  path = tmp_path / "old.csv"
  path.write_text("workload,framework,preset,status,time_to_train_s,host,started_at\n"
                  "resnet50,jax,mini,success,60,boxA,2025-01-01\n")
  frame = results.read_csv(str(path))
  assert frame.loc[0, "system"] == "boxA" and frame.loc[0, "mlperf_benchmark"] == "resnet"
  assert set(results.COLUMNS) <= set(frame.columns)


def test_a_row_that_cannot_be_appended_goes_to_a_recovery_file(tmp_path):
  log = tmp_path / "logs" / "resnet50_run.log"
  log.parent.mkdir()
  reached, message = results.save_row("/proc/cannot/write.csv", make_row(3), str(log))
  assert not reached
  recovery = tmp_path / "logs" / "resnet50_run.result.csv"
  assert message == (f"cannot append to /proc/cannot/write.csv (No such file or directory); "
                     f"row saved to {recovery}")
  assert list(results.read_csv(str(recovery))["run_id"]) == ["run3"]
  reached, message = results.save_row("/proc/cannot/write.csv", make_row(4), "/proc/nolog/x.log")
  assert not reached and "the row: run4," in message and "\n" not in message
  reached, message = results.save_row(str(tmp_path / "ok.csv"), make_row(5), str(log))
  assert reached and message.startswith("row appended to")


def test_read_csv_errors_name_the_file(tmp_path):
  with pytest.raises(UsageError, match="no such file"):
    results.read_csv(str(tmp_path / "missing.csv"))
  bad = tmp_path / "bad.csv"
  bad.write_bytes(b"\xff\xfe\x00garbage")
  with pytest.raises(UsageError, match="bad.csv"):
    results.read_csv(str(bad))


def test_a_commit_that_looks_like_a_number_reads_back_as_written(tmp_path):
  """A short commit of digits and one "e" is a float to a default CSV reader (93e5818 is inf)
  and one of digits loses its leading zero; the harness reads them, and every text column, as
  text."""
  path = str(tmp_path / "r.csv")
  for i, commit in enumerate(["93e5818", "0123456", "abc1234"]):
    results.append_row(path, make_row(i, git_commit=commit, run_id=f"{i}e9", host="1"))
  frame = results.read_csv(path)
  assert list(frame["git_commit"]) == ["93e5818", "0123456", "abc1234"]
  assert list(frame["run_id"]) == ["0e9", "1e9", "2e9"]
  assert list(frame["host"]) == ["1", "1", "1"]
  assert list(frame["seed"]) == [0, 1, 2]                      # numbers stay numbers
