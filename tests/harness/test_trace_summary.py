"""bench/trace_summary.py: a device's busy time and kernels by time from a Chrome trace, against
sums done by hand on a trace written here in jax.profiler's JSON form."""
import gzip
import json
import os

import pytest

from bench import trace_summary


def _trace():
  meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
          {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}}]
  kernels = [  # two streams of one device; stream 2's copy overlaps stream 1's gemm by 5 us
      (1, 0, 0, 40, "sm90_xmma_gemm_bf16bf16_bf16f32"),
      (1, 7, 35, 10, "copy_fusion_3"),
      (1, 0, 60, 20, "loop_multiply_fusion"),
      (1, 0, 100, 30, "cudnn_infer_ampere_scudnn_128x64_relu_xregs_large_nn_v1"),
      (1, 0, 150, 40, "sm90_xmma_gemm_bf16bf16_bf16f32"),
      (2, 3, 0, 500, "PjitFunction(train_step)"),       # a host event: not the device's
  ]
  events = [{"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": name}
            for pid, tid, ts, dur, name in kernels]
  return meta + events


def test_busy_time_is_the_union_of_the_device_kernels_intervals():
  summary = trace_summary.summarize(_trace(), steps=2)
  # [0, 45) + [60, 80) + [100, 130) + [150, 190) = 45 + 20 + 30 + 40 us in a 190 us window
  assert summary["busy_ms"] == pytest.approx(135e-3)
  assert summary["window_ms"] == pytest.approx(190e-3)
  assert summary["busy_fraction"] == pytest.approx(135 / 190)
  assert summary["per_step_ms"] == pytest.approx(135e-3 / 2)
  top = summary["top"]
  assert top[0][:2] == ("sm90_xmma_gemm_bf16bf16_bf16f32", "matmul")
  assert top[0][2] == pytest.approx(80e-3 / 2) and top[0][3] == pytest.approx(80 / 140)
  assert summary["categories"] == pytest.approx(
      {"matmul": 0.04, "convolution": 0.015, "fusion": 0.01, "copy": 0.005})
  assert "PjitFunction(train_step)" not in [name for name, *_ in top]
  assert trace_summary.category("loop_convert_multiply_fusion_23") == "fusion"
  assert trace_summary.category("wgrad2d_c1_k1_nhwc") == "convolution"
  assert trace_summary.category("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT") == "matmul"


def test_the_newest_trace_file_is_found_and_read(tmp_path):
  run = tmp_path / "plugins" / "profile" / "2026_11_27"
  run.mkdir(parents=True)
  with gzip.open(run / "perfetto_trace.json.gz", "wt") as f:
    json.dump({"traceEvents": _trace()}, f)
  found = trace_summary.trace_file(str(tmp_path))
  assert found == os.path.join(str(run), "perfetto_trace.json.gz")
  text = trace_summary.format_summary("t", trace_summary.summarize(
      trace_summary.load_events(found), steps=2))
  assert "device busy 71.1% of the traced window" in text and "matmul" in text
  assert trace_summary.trace_file(str(tmp_path / "plugins" / "none")) is None
  assert trace_summary.summarize(_trace()[:2], 1) is None     # no device kernels
