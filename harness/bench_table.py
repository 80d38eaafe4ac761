"""The peer-comparison table that `bench/all.py` writes and `report --bench` draws: one row per
(workload, framework) comparing our training step with a peer's, and one 'tf/jax' row per
workload comparing ours on the two frameworks. Neutral (pandas only): the bench scripts fill it,
the report reads it.

Columns: samples/s of each side (medians over interleaved rounds), the per-round ratio ours /
peer as median, min, max; model FLOPs per sample of each side (GFLOP, counted the same way on
both: 3 x the forward matmuls and convs of a traced train step) and the ratio of model-FLOP
rates (ratio_median x ours / peer GFLOP); MFU for GPU rows.
"""
import pandas as pd

from harness.errors import UsageError

COLUMNS = ("workload", "framework", "ours_samples_per_s", "peer", "peer_samples_per_s",
           "ratio_median", "ratio_min", "ratio_max", "ours_gflop_per_sample",
           "peer_gflop_per_sample", "model_flop_ratio", "mfu")
NUMBERS = tuple(c for c in COLUMNS if c not in ("workload", "framework", "peer"))


def read(path) -> pd.DataFrame:
  """A bench CSV, checked: a one-line UsageError naming the file and what is wrong."""
  try:
    frame = pd.read_csv(path)
  except (OSError, ValueError) as e:
    raise UsageError(f"--bench {path!r}: not a readable CSV ({e})") from None
  missing = [c for c in COLUMNS if c not in frame.columns]
  if missing:
    raise UsageError(f"--bench {path!r}: missing column(s) {', '.join(missing)}; allowed: "
                     "a table bench/all.py wrote")
  for column in NUMBERS:
    values = pd.to_numeric(frame[column], errors="coerce")
    bad = frame[column].notna() & values.isna()
    if bad.any():
      raise UsageError(f"--bench {path!r}: column {column} has {frame[column][bad].iloc[0]!r}; "
                       "allowed: numbers or blank")
    frame[column] = values
  return frame[list(COLUMNS)]
