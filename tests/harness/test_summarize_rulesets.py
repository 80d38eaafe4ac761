"""`summarize --ruleset R` on a folder holding benchmarks R has no rules for: it scores what R
covers and names each folder it skipped, in one line each; with nothing covered, one line and
exit 2 (it used to end in the compliance checker's FileNotFoundError)."""
import os
import shutil

from harness import summarize
from tests.conftest import ROOT

SYSTEM = os.path.join(ROOT, "..", "shared", "mlperf_results", "training_v3.1", "Dell", "results",
                      "XE8640x4H100-SXM-80GB")


def _system(tmp_path, *benchmarks, runs=1):
  """A system folder with the first `runs` logs of each benchmark (the round's own files)."""
  folder = tmp_path / "results" / "XE8640x4H100-SXM-80GB"
  for bench in benchmarks:
    (folder / bench).mkdir(parents=True)
    for i in range(runs):
      shutil.copy(os.path.join(SYSTEM, bench, f"result_{i}.txt"), folder / bench)
  return folder


def test_the_ruleset_s_benchmarks_lists_its_rule_files():
  covered = summarize.ruleset_benchmarks("4.0.0")
  assert {"bert", "resnet", "ssd", "unet3d", "gpt3"} <= set(covered)
  assert "rnnt" not in covered and "maskrcnn" not in covered and "common" not in covered
  assert "rnnt" in summarize.ruleset_benchmarks("3.1.0")


def test_uncovered_benchmarks_are_skipped_and_named(cli, tmp_path):
  folder = _system(tmp_path, "resnet", "rnnt")
  proc = cli("summarize", str(folder), "--ruleset", "4.0.0")
  assert proc.returncode == 0, proc.stderr
  assert "Traceback" not in proc.stderr
  lines = proc.stdout.splitlines()
  assert any(" resnet " in line for line in lines)
  (skip,) = [line for line in lines if line.startswith("skipped ")]
  assert skip.startswith("skipped XE8640x4H100-SXM-80GB/rnnt: ruleset 4.0.0 has no rules for "
                         "rnnt (it covers bert, ")


def test_nothing_covered_is_one_line_and_exit_2(cli, tmp_path):
  folder = _system(tmp_path, "rnnt")
  proc = cli("summarize", str(folder), "--ruleset", "4.0.0")
  assert proc.returncode == 2 and proc.stdout == ""
  (line,) = proc.stderr.strip().splitlines()
  assert "--ruleset 4.0.0 covers none of the benchmarks" in line and "1 skipped" in line
