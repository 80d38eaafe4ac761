"""The simulator against published measurements (harness/commsim/measurements.csv): the
figures the issue names, the held-out rows, the presets being the fit, and the table being
what it says (every row sourced, every exclusion explained)."""
import json
import statistics

import pytest

from harness import cli
from harness.commsim import calibrate, machine as machine_lib

ROWS = calibrate.load()


def _row(**match):
  (row,) = [r for r in ROWS if all(str(r[k]) == str(v) for k, v in match.items())]
  return row


def test_every_row_is_sourced_and_every_exclusion_explained():
  assert len(ROWS) >= 100
  for row in ROWS:
    assert row["source"].startswith("https://"), row
    assert row["role"] in ("fit", "holdout", "excluded"), row
    assert row["preset"] in machine_lib.PRESETS and row["busbw_GBps"] > 0, row
    assert row["note"], row
  roles = [r["role"] for r in ROWS]
  assert roles.count("holdout") > roles.count("fit") > 0
  machines = {(r["preset"], r["topology"]) for r in ROWS if r["role"] == "holdout"}
  assert {("dgx-a100", "multinode:1x8"), ("dgx-a100", "multinode:2x8"),
          ("dgx-a100", "multinode:3x8"), ("dgx-h100", "multinode:1x8"),
          ("tpu-v5e", "mesh:4x1")} <= machines


def test_the_issue_s_example_is_within_ten_percent(capsys):
  """`simulate --machine dgx-a100 --topology multinode:1x8 --bytes 1GB`: the best algorithm's
  bus bandwidth against NCCL's published 1 GiB figures on 8 NVSwitch A100s (the ideal model
  said 295.7 GB/s, 28% above them)."""
  code = cli.main(["simulate", "--machine", "dgx-a100", "--topology", "multinode:1x8",
                   "--bytes", "1GB", "--json"])
  doc = json.loads(capsys.readouterr().out)
  best = max(r["busbw_GBps"] for r in doc["results"])
  assert code == 0
  for row in [r for r in ROWS if r["preset"] == "dgx-a100" and r["topology"] == "multinode:1x8"
              and r["bytes"] == 2 ** 30 and r["role"] != "excluded"]:
    assert abs(best / row["busbw_GBps"] - 1) < calibrate.TOLERANCE, row


REPORT = calibrate.report(ROWS)


@pytest.mark.parametrize("row", [r for r in REPORT if r["role"] == "holdout"
                                 and r["bytes"] >= 256 * 2 ** 20],
                         ids=lambda r: f"{r['id']}-{r['preset']}-{r['bytes']:.0f}")
def test_held_out_bandwidth_figures_within_ten_percent(row):
  """Every held-out figure of a message of 256 MiB or more (the bandwidth-bound figures:
  each machine's peak bus bandwidth, the H100 ring and NVLS figures, the H800 with its NVLink
  cut, two nodes over eight rails) within 10%."""
  assert abs(row["error"]) < calibrate.TOLERANCE, row


def test_held_out_rows_of_every_size():
  """All held-out rows: the median within 5%, none beyond 25% (the latency-bound rows of
  another system than the fit's, whose launch latency differs: Azure's H100 1 KB figure is
  40% above Voltage Park's on the same GPUs), and the H100 ring figure predicted from the
  A100's fitted link terms."""
  errors = [abs(r["error"]) for r in REPORT if r["role"] == "holdout"]
  assert statistics.median(errors) < 0.05 and max(errors) < 0.25
  ring = [r for r in REPORT if r["algorithms"] == "no-nvls"]
  assert ring and all(abs(r["error"]) < calibrate.TOLERANCE for r in ring)
  h800 = [r for r in REPORT if r["link_bandwidth_GBps"]]
  assert h800 and all(abs(r["error"]) < calibrate.TOLERANCE for r in h800)


def test_the_ideal_model_misses_what_the_fitted_one_reaches():
  """With the efficiency terms off (--ideal) the ring figures of one NVSwitch node are more
  than 20% high (A100 at 1 GiB and up, the H100 under NCCL_ALGO=RING): what the terms are for.
  (Its H100 default figure is close by chance: an ideal ring at the full NVLink rate happens
  to land near what NVLS reaches at 67% of it.)"""
  ideal = {name: machine_lib.dataclasses.replace(p, efficiency=None)
           for name, p in machine_lib.PRESETS.items()}
  rings = [r for r in ROWS if r["role"] == "holdout" and r["bytes"] >= 2 ** 30
           and r["topology"] == "multinode:1x8"
           and (r["preset"] == "dgx-a100" or r["algorithms"] == "no-nvls")]
  assert len(rings) >= 4
  assert all(r["error"] > 0.2 for r in calibrate.report(rings, ideal))
  assert all(abs(r["error"]) < calibrate.TOLERANCE for r in calibrate.report(rings))


@pytest.mark.slow
def test_the_presets_carry_the_fit():
  """`python -m harness.commsim.calibrate --fit` on the table reproduces the presets (so they are
  the fit, not tuned by hand): the well-determined terms to 2%, and every row's simulated
  figure to 1% of the measured one. Terms the data barely constrain (a step latency near 0, a
  piece size where one protocol never wins) may land elsewhere with another BLAS or CPU; the
  figures they produce may not."""
  fitted = calibrate.fit(ROWS)
  presets = machine_lib.PRESETS
  a100, h100 = presets["dgx-a100"].efficiency, presets["dgx-h100"].efficiency
  assert fitted["dgx-a100"]["link"] == pytest.approx(a100.link, rel=0.02)
  assert fitted["dgx-a100"]["network"] == pytest.approx(a100.network, rel=0.02)
  assert fitted["dgx-h100"]["nvls"] == pytest.approx(h100.nvls, rel=0.02)
  assert fitted["tpu-v5e"]["link"] == pytest.approx(presets["tpu-v5e"].efficiency.link,
                                                    rel=0.02)
  a, h = fitted["dgx-a100"], fitted["dgx-h100"]
  base = machine_lib.Efficiency(
      link=a["link"], network=a["network"], launch=a["launch_us"] * 1e-6,
      protocols=calibrate._protocols(a["LL_us"], a["LL128_us"], a["Simple_us"],
                                     a["LL128_piece_MB"], a["Simple_piece_MB"]))
  refit = {**presets,
           "dgx-a100": machine_lib.dataclasses.replace(presets["dgx-a100"], efficiency=base),
           "dgx-h100": machine_lib.dataclasses.replace(presets["dgx-h100"], efficiency=(
               machine_lib.dataclasses.replace(base, nvls=h["nvls"],
                                               nvls_latency=h["nvls_latency_us"] * 1e-6,
                                               launch=h["launch_us"] * 1e-6,
                                               nvls_piece=h["nvls_piece_MB"] * 1e6))),
           "tpu-v5e": machine_lib.dataclasses.replace(presets["tpu-v5e"], efficiency=(
               machine_lib.Efficiency(link=fitted["tpu-v5e"]["link"])))}
  for ours, theirs in zip(REPORT, calibrate.report(ROWS, refit)):
    if ours["role"] != "excluded":
      assert theirs["error"] == pytest.approx(ours["error"], abs=0.01), ours["id"]
