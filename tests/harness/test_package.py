"""`package`: result CSV rows -> an MLPerf submission folder the official package checker
accepts. The baseline's real mini ResNet runs (5 JAX, 5 TF) packaged as an open-division
submission pass `check` (mlperf_logging's package checker), `summarize` on the package equals
`summarize` on the CSV, and the system descriptions pass the official system-description
checker; each refusal is one line, exit 2, and writes nothing."""
import json
import os
import shutil

import pandas as pd
import pytest
from mlperf_logging.system_desc_checker import system_desc_checker

from harness import cli, package, summarize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASELINE = os.path.join(ROOT, "results", "baseline_cpu_mini.csv")


def _run(capsys, *argv):
  code = cli.main(list(argv))
  out, err = capsys.readouterr()
  return code, out, err


def baseline_rows(tmp_path, edit=None, name="rows.csv"):
  """The baseline's resnet rows with absolute log paths (copied: edits never touch them)."""
  frame = pd.read_csv(BASELINE)
  frame = frame[frame["workload"] == "resnet50"].sort_values(["framework", "started_at"])
  # the ruleset's 5 a framework, the latest (as summarize scores a group: the baseline holds 6,
  # the gate's least for 14 groups)
  frame = frame.groupby("framework").tail(5).copy()
  logs = tmp_path / "logs"
  logs.mkdir(exist_ok=True)
  paths = []
  for path in frame["log_path"]:
    target = logs / os.path.basename(path)
    shutil.copyfile(os.path.join(ROOT, path), target)
    paths.append(str(target))
  frame["log_path"] = paths
  if edit:
    frame = edit(frame)
  csv = tmp_path / name
  frame.to_csv(csv, index=False)
  return str(csv)


def test_baseline_runs_package_into_a_submission_the_official_checker_passes(tmp_path, capsys):
  csv = baseline_rows(tmp_path)
  out = tmp_path / "package"
  code, stdout, _ = _run(capsys, "package", csv, "--submitter", "harness-ci", "--system",
                         "cpu2", "--out", str(out))
  assert code == 0, stdout
  org = out / "training_v4.0" / "harness-ci"
  assert "package check: PASSED" in stdout.splitlines()[-2]
  for framework in ("jax", "tf"):
    results = sorted(os.listdir(org / "results" / f"cpu2-{framework}" / "resnet"))
    assert results == [f"result_{i}.txt" for i in range(5)]
  # the logs were copied, not moved; oldest first
  frame = pd.read_csv(csv)
  assert all(os.path.isfile(p) for p in frame["log_path"])
  jax = frame[frame["framework"] == "jax"].sort_values("started_at")
  with open(jax["log_path"].iloc[0]) as a, open(org / "results/cpu2-jax/resnet/result_0.txt") as b:
    assert a.read() == b.read()
  # `check` on the package says the same (the official package checker, on a copy)
  code, stdout, _ = _run(capsys, "check", str(org))
  assert code == 0 and stdout.splitlines()[-1].startswith("package check: PASSED")
  # the same olympic scores from the package as from the CSV
  ours = summarize.summarize([csv]).set_index("framework")["score_min"]
  packaged = summarize.summarize([str(out / "training_v4.0")]).set_index("system")["score_min"]
  for framework in ("jax", "tf"):
    assert packaged[f"cpu2-{framework}"] == pytest.approx(ours[framework], rel=1e-12)


def test_system_json_has_every_field_the_official_checker_requires(tmp_path, capsys):
  """Checked by mlperf_logging's own check_system_desc (not by our reading of it); fields
  given with --system-json are kept, the rest the runs recorded."""
  given = tmp_path / "given.json"
  given.write_text(json.dumps({"host_processor_model_name": "AMD EPYC", "cooling": "air"}))
  out = tmp_path / "package"
  code, stdout, _ = _run(capsys, "package", baseline_rows(tmp_path), "--submitter", "org",
                         "--system", "box", "--out", str(out), "--system-json", str(given))
  assert code == 0, stdout
  path = out / "training_v4.0" / "org" / "systems" / "box-jax.json"
  valid, name, _, _ = system_desc_checker.check_system_desc(str(path), "training", "4.0.0")
  assert valid and name == "box-jax"
  desc = json.loads(path.read_text())
  assert desc["host_processor_model_name"] == "AMD EPYC" and desc["cooling"] == "air"
  assert desc["division"] == "open" and desc["accelerator_model_name"] == "cpu"
  assert desc["accelerators_per_node"] == "1" and desc["framework"].startswith("jax ")
  required, statuses = package.system_desc_rules()
  assert set(required) == set(desc) and desc["status"] in statuses
  assert "still to fill in (21): host_processors_per_node, host_processor_core_count" in stdout
  # a field short of what the official checker requires: it says so
  del desc["host_storage_type"]
  path.write_text(json.dumps(desc))
  assert not system_desc_checker.check_system_desc(str(path), "training", "4.0.0")[0]


def _closed(frame):
  """One TF log rewritten as closed division (as a reference run's log says)."""
  path = frame[frame["framework"] == "tf"]["log_path"].iloc[-1]
  with open(path) as f:
    text = f.read()
  with open(path, "w") as f:
    f.write(text.replace('"submission_division", "value": "open"',
                         '"submission_division", "value": "closed"'))
  return frame


def _other_system(frame):
  frame.loc[frame.index[-1], "system"] = "8xh100"
  return frame


@pytest.mark.parametrize("edit,extra,message", [
    (lambda f: f.iloc[1:], [], "resnet (jax, mini): 4 finished runs; the round needs 5 per "
                               "benchmark; allowed: `run --runs 5` first"),
    (_closed, [], "resnet (tf, mini): the logs mix divisions closed and open; allowed: one per "
                  "benchmark folder"),
    (_other_system, [], "resnet (tf, mini): the runs span systems 2-core-cpu, 8xh100; allowed: "
                        "one per benchmark folder"),
    (None, ["--division", "closed"], "--division closed: the resnet runs (jax, mini) are "
                                     "open-division (their logs say so); allowed: --division "
                                     "open"),
    (None, ["--submitter", "my org"], "--submitter 'my org': allowed: letters, digits"),
])
def test_refusals_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, edit, extra, message):
  csv = baseline_rows(tmp_path, edit)
  out = tmp_path / "package"
  argv = _with(["package", csv, "--submitter", "org", "--system", "box", "--out", str(out)],
               extra)
  code, _, err = _run(capsys, *argv)
  assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
  assert not out.exists()


def _with(argv, extra):
  """argv with each (--flag, value) of `extra` set (replaced when present)."""
  argv = list(argv)
  for flag, value in zip(extra[::2], extra[1::2]):
    if flag in argv:
      argv[argv.index(flag) + 1] = value
    else:
      argv += [flag, value]
  return argv


def test_an_existing_folder_is_refused_unless_force(tmp_path, capsys):
  csv = baseline_rows(tmp_path)
  out = tmp_path / "package"
  out.mkdir()
  (out / "keep.txt").write_text("mine")
  code, _, err = _run(capsys, "package", csv, "--submitter", "org", "--system", "box", "--out",
                      str(out))
  assert code == 2 and "--out" in err and "exists" in err
  assert os.listdir(out) == ["keep.txt"]
  code, stdout, _ = _run(capsys, "package", csv, "--submitter", "org", "--system", "box",
                         "--out", str(out), "--force")
  assert code == 0 and (out / "keep.txt").read_text() == "mine", stdout


def test_a_benchmark_mlperf_does_not_have_goes_to_the_open_division_in_one_line(tmp_path,
                                                                                 capsys):
  """EfficientNet rows (here the baseline's JAX rows relabelled): their own folder name, open
  division, and one line saying the official checker skips it."""
  def efficientnet(frame):
    frame = frame[frame["framework"] == "jax"].copy()
    frame["workload"], frame["mlperf_benchmark"] = "efficientnet", "efficientnet"
    return frame
  out = tmp_path / "package"
  code, stdout, _ = _run(capsys, "package", baseline_rows(tmp_path, efficientnet),
                         "--submitter", "org", "--system", "box", "--out", str(out))
  assert ("efficientnet: no MLPerf 4.0.0 benchmark of that name; packaged in the open division "
          "under its own name (the official checker skips it)") in stdout
  org = out / "training_v4.0" / "org"
  assert len(os.listdir(org / "results" / "box" / "efficientnet")) == 5
  assert json.loads((org / "systems" / "box.json").read_text())["division"] == "open"
