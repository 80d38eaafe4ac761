"""Compare two result CSVs: the regression gate CI calls.

Rows are matched on (workload, framework, preset). Per side: the median time-to-train of the
successful runs and the median throughput. A row regresses when time-to-train grows, or
throughput falls, by more than the threshold AND the change is larger than the run-to-run
noise seen on either side (half the relative spread, max-min over median), when a side has
several runs; or when the new side has no successful run where the baseline had one. A key the
new CSV lacks is reported as `missing`, and fails the gate only with require_all (a CI job that
must cover every baseline workload).
"""
import pandas as pd

from harness import results

KEYS = ["workload", "framework", "preset"]


def _side(frame: pd.DataFrame) -> pd.DataFrame:
  ok = frame[frame["status"] == "success"]
  grouped = frame.groupby(KEYS)
  out = pd.DataFrame({"runs": grouped.size()})
  out["success"] = ok.groupby(KEYS).size()
  out["success"] = out["success"].fillna(0).astype(int)
  tt = ok.groupby(KEYS)["time_to_train_s"]
  out["ttt_s"] = tt.median()
  out["ttt_noise"] = (tt.max() - tt.min()) / tt.median() / 2
  tp = ok.groupby(KEYS)["throughput"]
  out["throughput"] = tp.median()
  out["tp_noise"] = (tp.max() - tp.min()) / tp.median() / 2
  return out


def _verdict(row, threshold):
  if pd.isna(row["runs_new"]):
    return "missing"
  if row["success_base"] > 0 and row["success_new"] == 0:
    return "regression (no successful run)"
  reasons = []
  noise_t = max(row["ttt_noise_base"], row["ttt_noise_new"], 0.0) if pd.notna(
      row["ttt_noise_base"]) else 0.0
  if pd.notna(row["ttt_ratio"]) and row["ttt_ratio"] > 1 + max(threshold, noise_t):
    reasons.append("time-to-train")
  noise_p = max(row["tp_noise_base"], row["tp_noise_new"], 0.0) if pd.notna(
      row["tp_noise_base"]) else 0.0
  if pd.notna(row["throughput_ratio"]) and row["throughput_ratio"] < 1 - max(threshold, noise_p):
    reasons.append("throughput")
  if reasons:
    return "regression (" + ", ".join(reasons) + ")"
  if (pd.notna(row["ttt_ratio"]) and row["ttt_ratio"] < 1 - threshold) or (
      pd.notna(row["throughput_ratio"]) and row["throughput_ratio"] > 1 + threshold):
    return "improvement"
  return "ok"


def compare(baseline_path: str, new_path: str, threshold: float) -> pd.DataFrame:
  base = _side(results.read_csv(baseline_path))
  new = _side(results.read_csv(new_path))
  table = base.join(new, how="outer", lsuffix="_base", rsuffix="_new")
  table = table[table["runs_base"].notna()]          # keys only the new side has: not gated
  table["ttt_ratio"] = table["ttt_s_new"] / table["ttt_s_base"]
  table["throughput_ratio"] = table["throughput_new"] / table["throughput_base"]
  table["verdict"] = [_verdict(row, threshold) for _, row in table.iterrows()]
  columns = ["runs_base", "runs_new", "ttt_s_base", "ttt_s_new", "ttt_ratio", "throughput_base",
             "throughput_new", "throughput_ratio", "verdict"]
  return table[columns].reset_index()


def is_regression(table: pd.DataFrame, require_all: bool = False) -> bool:
  failing = ("regression", "missing") if require_all else ("regression",)
  return bool(table["verdict"].str.startswith(failing).any())
