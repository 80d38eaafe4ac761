#!/usr/bin/env bash
# What a JAX accelerator image (JAX, flax, optax, numpy, scipy; no TensorFlow) lacks for the
# harness's own JAX runs: mlperf-logging (the compliance log), PyYAML (the rules files) and
# pycocotools (SSD's COCO mAP, imported with its workload), at
# requirements.txt's pins. A JAX run imports TensorFlow only where a pipeline reads files, pandas
# only to upgrade an older result CSV, tensorboardX only with --tensorboard
# (tests/parallel/test_jax_without_tensorflow.py). Run here, where PyPI is reachable; it installs
# wheels for each Python version given (default 3.10-3.13) into .gpu_deps/cpXY, about 6 MB each,
# a folder that travels with the device run:
#   bash bench/gpu_deps.sh            then, on the device:
#   PYTHONPATH=.gpu_deps/cp$(python3 -c 'import sys; print("%d%d" % sys.version_info[:2])') \
#     python3 run_benchmark.py run resnet50 --preset synthetic --framework jax
# (the device tool's `carry: [".gpu_deps"]`). GPU_DEPS_DIR=DIR installs elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
pins=$(grep -E '^(mlperf-logging|PyYAML|pycocotools)==' requirements.txt | cut -d' ' -f1)
for version in ${@:-3.10 3.11 3.12 3.13}; do
  target="${GPU_DEPS_DIR:-.gpu_deps}/cp${version/./}"
  rm -rf "$target"
  python3 -m pip install -q --target "$target" --python-version "$version" \
    --platform manylinux2014_x86_64 --only-binary=:all: --no-deps $pins
  echo "$target: $(ls "$target" | grep -v dist-info | tr '\n' ' ')"
done
