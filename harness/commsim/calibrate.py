"""The simulator against measured machines: measurements.csv (published all-reduce bus
bandwidths, each with its source), the fit of the presets' efficiency terms to the rows marked
`fit`, and the error on every other row.

    python -m harness.commsim.calibrate          # every row: measured, simulated, error
    python -m harness.commsim.calibrate --fit    # refit: the figures machine.py's presets carry

A row is simulated as `simulate` runs it: the preset's machine on the row's topology (and NIC
count, and link bandwidth where the row's machine differs from the preset's), every algorithm
that runs there (NCCL picks its fastest; `no-nvls`: without in-network reduction, as under
NCCL_ALGO=RING), the fastest one's bus bandwidth. Roles: `fit` rows fit the terms (every other
size of one sweep per machine), `holdout` rows check them (the other sizes, other sources,
other machines), `excluded` rows are kept with the reason they cannot be simulated.

The fit, in order (each step uses the terms the earlier ones fixed):
  dgx-a100             link (NVLink) and network (InfiniBand) efficiency, launch, the step
                       latency of LL, LL128 and Simple and the piece size of LL128 and Simple
                       (NCCL's protocols: bandwidth fractions 1/2, 15/16, 1), on one node and
                       on three nodes of four NICs together
  dgx-h100             NVLS efficiency and latency, and the launch; link efficiency and
                       protocols are the A100's (the same NCCL on NVLink of another generation),
                       so the H100 ring figure is a prediction, not a fit
  tpu-v5e              ICI link efficiency, on the large all-gather; tpu-v4 carries it too
Residuals are log(simulated / measured) bus bandwidth, so every size weighs the same.
"""
import argparse
import csv
import dataclasses
import math
import os

import numpy as np

from harness.commsim import algorithms, machine as machine_lib, timing

TABLE = os.path.join(os.path.dirname(__file__), "measurements.csv")
TOLERANCE = 0.10                 # every holdout row within 10% (issue 41)
MB, US = 1e6, 1e-6


def load(path=TABLE) -> list[dict]:
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f))
  for row in rows:
    row["bytes"] = float(row["bytes"])
    row["busbw_GBps"] = float(row["busbw_GBps"])
  return rows


def _machine(row, preset):
  kwargs = dict(link_bandwidth=preset.link_bandwidth, link_latency=preset.link_latency,
                overhead=preset.overhead, injection_bandwidth=preset.injection_bandwidth,
                network_bandwidth=preset.network_bandwidth,
                network_latency=preset.network_latency, efficiency=preset.efficiency,
                nics_per_node=int(row["nics_per_node"] or 0) or preset.nics_per_node)
  if row["link_bandwidth_GBps"]:
    kwargs["link_bandwidth"] = float(row["link_bandwidth_GBps"]) * 1e9
  return machine_lib.Machine(row["topology"], **kwargs)


def simulated_busbw(row, preset) -> tuple[float, str]:
  """(bus bandwidth in GB/s, 'algorithm/protocol') of the fastest algorithm for the row."""
  machine = _machine(row, preset)
  names = [n for n in algorithms.applicable(machine, row["collective"])
           if not (row["algorithms"] == "no-nvls" and n == "nvls")]
  best = min(((timing.simulate(machine, algorithms.build(machine, row["collective"], n),
                               row["bytes"]), n) for n in names), key=lambda tn: tn[0].time_s)
  return best[0].busbw / 1e9, f"{best[1]}/{best[0].protocol}"


def report(rows=None, presets=None) -> list[dict]:
  presets = presets or machine_lib.PRESETS
  out = []
  for row in rows or load():
    if row["role"] == "excluded":
      out.append({**row, "simulated_GBps": float("nan"), "error": float("nan"), "how": ""})
      continue
    sim, how = simulated_busbw(row, presets[row["preset"]])
    out.append({**row, "simulated_GBps": sim, "error": sim / row["busbw_GBps"] - 1, "how": how})
  return out


# ----------------------------------------------------------------------------- the fit

def _protocols(ll, ll128, simple, ll128_piece_mb, simple_piece_mb):
  return (machine_lib.Protocol("LL", ll * US, 0.5),
          machine_lib.Protocol("LL128", ll128 * US, 15 / 16, ll128_piece_mb * MB),
          machine_lib.Protocol("Simple", simple * US, 1.0, simple_piece_mb * MB))


def _least_squares(residuals, x0, lower, upper):
  from scipy.optimize import least_squares          # pylint: disable=import-outside-toplevel
  return least_squares(residuals, x0, bounds=(lower, upper), x_scale="jac").x


def _residuals(rows, preset_of):
  def fn(x):
    preset = preset_of(x)
    return np.array([math.log(simulated_busbw(r, preset)[0] / r["busbw_GBps"]) for r in rows])
  return fn


def fit(rows=None) -> dict:
  """The efficiency terms of dgx-a100 and dgx-h100 fitted to the `fit` rows."""
  rows = [r for r in (rows or load()) if r["role"] == "fit"]
  a100 = machine_lib.PRESETS["dgx-a100"]
  a100_rows = [r for r in rows if r["preset"] == "dgx-a100"]
  h100_rows = [r for r in rows if r["preset"] == "dgx-h100"]

  def a100_with(x):
    link, network, launch = x[:3]
    return dataclasses.replace(a100, efficiency=machine_lib.Efficiency(
        link=link, network=network, launch=launch * US, protocols=_protocols(*x[3:])))
  x = _least_squares(_residuals(a100_rows, a100_with), [0.8, 0.9, 20, 1, 3, 5, 1, 1],
                     [0.3, 0.3, 0, 0, 0, 0, 0.01, 0.01], [1, 1, 200, 20, 50, 100, 64, 64])
  link, network, launch, ll, ll128, simple, ll128_piece, simple_piece = x
  base = a100_with(x).efficiency

  h100 = machine_lib.PRESETS["dgx-h100"]

  def h100_with(x):
    return dataclasses.replace(h100, efficiency=dataclasses.replace(
        base, nvls=x[0], nvls_latency=x[1] * US, launch=x[2] * US,
        nvls_piece=x[3] * MB))
  nvls, nvls_latency, h_launch, nvls_piece = _least_squares(
      _residuals(h100_rows, h100_with), [0.7, 5, launch, 4], [0.2, 0, 0, 0], [1, 200, 200, 256])
  v5e = machine_lib.PRESETS["tpu-v5e"]

  def v5e_with(x):
    return dataclasses.replace(v5e, efficiency=machine_lib.Efficiency(link=x[0]))
  (ici,) = _least_squares(_residuals([r for r in rows if r["preset"] == "tpu-v5e"], v5e_with),
                          [0.8], [0.3], [1.0])
  return {"tpu-v5e": {"link": ici},
          "dgx-a100": {"link": link, "network": network, "launch_us": launch, "LL_us": ll,
                       "LL128_us": ll128, "Simple_us": simple, "LL128_piece_MB": ll128_piece,
                       "Simple_piece_MB": simple_piece},
          "dgx-h100": {"nvls": nvls, "nvls_latency_us": nvls_latency, "launch_us": h_launch,
                       "nvls_piece_MB": nvls_piece}}


def print_report(out):
  import pandas as pd                                # pylint: disable=import-outside-toplevel
  frame = pd.DataFrame(out)
  frame["MB"] = frame["bytes"] / 1e6
  frame["error_%"] = frame["error"] * 100
  frame["source"] = frame["source"].str.replace("https://github.com/", "", regex=False).str[:48]
  columns = ["id", "preset", "topology", "role", "MB", "busbw_GBps", "simulated_GBps", "error_%",
             "how", "source"]
  with pd.option_context("display.width", 220, "display.max_rows", 500):
    print(frame[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
  for role in ("fit", "holdout"):
    errors = frame.loc[frame["role"] == role, "error"].abs()
    print(f"{role}: {len(errors)} rows, max |error| {errors.max() * 100:.1f}%, "
          f"median {errors.median() * 100:.1f}%")
  print(f"excluded: {int((frame['role'] == 'excluded').sum())} rows (the note says why)")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--fit", action="store_true", help="refit and print the terms")
  args = parser.parse_args(argv)
  if args.fit:
    for name, terms in fit().items():
      print(name, {k: round(v, 4) for k, v in terms.items()})
    return 0
  print_report(report())
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
