"""A row that cannot be appended at the end of a run is saved beside the log, not lost."""
from harness import driver, results
from tests.harness.test_driver import ScriptedTrainer
from workloads.resnet import spec


def test_final_append_failure_goes_to_recovery_csv(tmp_path, capsys):
  target = tmp_path / "results.csv"
  results.check_writable(str(target))             # the pre-run check passes ...
  target.unlink()
  target.mkdir()                                  # ... then the file turns into a folder
  cfg = spec.mini()
  cfg.train.global_batch_size = 64
  opts = driver.RunOptions(framework="jax", preset="mini", seed=1, results_path=str(target),
                           log_dir=str(tmp_path / "logs"))
  rows = driver.run_all(spec.SPEC, cfg, opts, lambda seed: ScriptedTrainer([0.95]))
  recovery = rows[0].log_path[:-len(".log")] + ".result.csv"
  out = capsys.readouterr()
  line = [l for l in out.out.splitlines() if "run_stop" in l][0]
  assert f"cannot append to {target} (Is a directory); row saved to {recovery}" in line
  assert "Traceback" not in out.err
  saved = results.read_csv(recovery)
  assert list(saved["run_id"]) == [rows[0].run_id] and saved.loc[0, "status"] == "success"
