"""`check FOLDER`: mlperf_logging's package_checker on a copy, one verdict per file."""
import os

import pytest

from harness import cli, package_check
from tests.conftest import SHARED_RESULTS

TINYCORP = os.path.join(os.path.dirname(SHARED_RESULTS), "training_v4.0", "tinycorp")


def _listing(top):
  return sorted((d, f, os.path.getmtime(os.path.join(d, f)))
                for d, _, files in os.walk(top) for f in files)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(TINYCORP), reason="../shared/mlperf_results missing")
def test_package_check_of_a_real_submission(capsys):
  """tinycorp v4.0: one log without run_stop (tolerated under olympic scoring), RCP checks
  passed, system descriptions with an invalid status: the package fails, the folder is
  untouched (the checker's RCP step writes scaling.json, but only in its copy)."""
  before = _listing(TINYCORP)
  assert cli.main(["check", os.path.join(TINYCORP, "results")]) == 1
  lines = capsys.readouterr().out.splitlines()
  assert _listing(TINYCORP) == before
  per_file = [l for l in lines if l.endswith(".txt") or ".txt  (" in l]
  assert len(per_file) == 10
  assert [l.split()[0] for l in per_file].count("FAIL") == 1
  assert per_file[0].startswith("FAIL  results/tinybox_green/resnet/result_0.txt") and \
      "'run_stop' but found 0" in per_file[0]
  folders = [l for l in lines if "/resnet/  (" in l]
  assert len(folders) == 2 and all(l.startswith("PASS") and "RCP passed" in l for l in folders)
  assert any("System description checker failed for tinybox red" in l for l in lines)
  assert lines[-1] == f"package check: FAILED ({TINYCORP}, ruleset 4.0.0)"


def test_rcp_batch_sizes_per_round():
  assert 3264 in package_check.rcp_batch_sizes("resnet", "4.0.0")
  assert 448 in package_check.rcp_batch_sizes("bert", "5.0.0")
  assert package_check.rcp_batch_sizes("transformer", "0.7.0") == []   # no RCPs before 1.0
  assert "none for transformer" in cli._rcp_line("transformer", 1024)
  assert cli._rcp_line("resnet", 3264).endswith("(this batch size has one)")
  assert cli._rcp_line("resnet", 64, "mini").endswith(
      "(this batch size is outside them); a mini run is open division: not RCP-checked")


def test_check_of_a_folder_that_is_no_submission(tmp_path, capsys):
  assert cli.main(["check", str(tmp_path)]) == 2
  assert "is not a submission folder" in capsys.readouterr().err
