"""`report`: the committed baseline renders into one self-contained page whose numbers are
summarize's and whose every plot is a real, non-blank PNG."""
import base64
import io
import os
import re

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from harness import cli, registry, results, summarize
from tests.conftest import ROOT

BASELINE = os.path.join(ROOT, "results", "baseline_cpu_mini.csv")


def _images(page):
  return [matplotlib.image.imread(io.BytesIO(base64.b64decode(b)), format="png")
          for b in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


@pytest.fixture(scope="module")
def slower_csv(tmp_path_factory):
  """The baseline with every time-to-train 30% longer: a planted regression."""
  frame = results.read_csv(BASELINE)
  frame["time_to_train_s"] *= 1.3
  path = str(tmp_path_factory.mktemp("new") / "new.csv")
  frame[results.COLUMNS].to_csv(path, index=False)
  return path


def test_report_of_the_committed_baseline(tmp_path, capsys):
  out = tmp_path / "report"
  assert cli.main(["report", BASELINE, "--out", str(out)]) == 0
  assert capsys.readouterr().out.strip() == f"report written to {out}/index.html"
  page = (out / "index.html").read_text()
  assert 'src="http' not in page and "<script" not in page and "<link" not in page  # one file
  expected = summarize.summarize([BASELINE])
  shown = [float(v) for v in re.findall(r'class="score_min" data-value="([^"]+)"', page)]
  assert shown == list(expected["score_min"])                        # exact, in order
  images = _images(page)
  workloads = sorted(set(results.read_csv(BASELINE)["workload"]))
  assert workloads == registry.names()                              # every registered one
  n = len(workloads)
  for workload in workloads:                                        # one section each
    assert f"<h2 id='{workload}'>{workload}</h2>" in page
  assert len(images) == 3 * n and page.count("<img ") == 3 * n     # curves, ttt, history
  for image in images:
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert np.ptp(image[..., :3]) > 0.5                              # not blank


def test_report_with_a_baseline_shows_the_regression(tmp_path, slower_csv):
  out = tmp_path / "report"
  assert cli.main(["report", slower_csv, "--baseline", BASELINE, "--out", str(out)]) == 0
  page = (out / "index.html").read_text()
  assert "<h2>Baseline vs new: REGRESSION</h2>" in page
  ratios = [float(v) for v in re.findall(r'class="ttt_ratio" data-value="([^"]+)"', page)]
  n = len(registry.names())
  assert ratios == pytest.approx([1.3] * 2 * n)               # every workload x 2 frameworks
  assert len(_images(page)) == 3 * n + 1


def test_report_of_a_missing_csv_writes_nothing(tmp_path, capsys):
  assert cli.main(["report", str(tmp_path / "none.csv"), "--out", str(tmp_path / "r")]) == 2
  assert "no such result CSV" in capsys.readouterr().err
  assert not (tmp_path / "r").exists()


BENCH = os.path.join(ROOT, "results", "bench_cpu.csv")


def test_report_draws_the_committed_bench_table(tmp_path):
  """bench/all.py's table: one section, a non-blank chart, every ratio shown exactly."""
  out = tmp_path / "report"
  assert cli.main(["report", "--bench", BENCH, "--out", str(out)]) == 0
  page = (out / "index.html").read_text()
  assert "<h2 id='bench'>Throughput against peers</h2>" in page
  table = pd.read_csv(BENCH)
  assert set(table["workload"]) == {"resnet50", "bert", "transformer", "ssd", "efficientnet"}
  shown = [float(v) for v in re.findall(r'class="ratio_median" data-value="([^"]+)"', page)]
  assert shown == list(table["ratio_median"])
  (image,) = _images(page)
  assert image.shape[1] > 300 and np.ptp(image[..., :3]) > 0.5


def test_report_of_a_bad_bench_table_writes_nothing(tmp_path, capsys):
  bad = tmp_path / "bench.csv"
  pd.read_csv(BENCH).drop(columns=["ratio_median"]).to_csv(bad, index=False)
  assert cli.main(["report", "--bench", str(bad), "--out", str(tmp_path / "r")]) == 2
  assert "missing column(s) ratio_median" in capsys.readouterr().err
  assert cli.main(["report", "--out", str(tmp_path / "r")]) == 2
  assert "no input" in capsys.readouterr().err
  assert not (tmp_path / "r").exists()
