#!/usr/bin/env bash
# One GPU session's measurements for issue 53, in the order that matters, inside one deadline
# (a lent GPU gives one call of at most 10 minutes): each step gets what time is left, a step
# that cannot start with its minimum left is skipped and says so, and every line goes to
# $OUT/gpu.log as it comes (tee; a pipe through grep would hold it back until a timeout kills it).
#
#   bash bench/gpu_deps.sh 3.12          # here, where PyPI is reachable; carry .gpu_deps
#   OUT=/some/dir DEADLINE=580 bash bench/gpu_session.sh [transformer efficientnet probe bert_packed]
#
# Steps (default: all, in this order):
#   transformer   the harness run and the bare step of Transformer-big, with a profile
#   efficientnet  EfficientNet-B0's harness run in bf16 and in float32, and its bare step
#   probe         bench/nan_probe.py on EfficientNet in bf16: the first non-finite step and op
#   bert_packed   BERT's harness run on packed rows (64 samples a step in 32 rows of 512)
# PYTHON (python3) and PRESET (synthetic; `tiny` with SETS="data.source=synthetic" checks the
# plumbing on a CPU) are for that check.
set -u
PY=${PYTHON:-python3}
PRESET=${PRESET:-synthetic}
SET=()
for item in ${SETS:-}; do SET+=(--set "$item"); done
OUT=${OUT:-gpu_session_out}
DEADLINE=${DEADLINE:-580}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.gpu_deps/cp312${PYTHONPATH:+:$PYTHONPATH}
LOG=$OUT/gpu.log
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(transformer efficientnet probe bert_packed)

left() { echo $((DEADLINE - SECONDS)); }
# step NAME MINIMUM COMMAND...: runs COMMAND under the time left, or says why it did not
step() {
  local name=$1 minimum=$2; shift 2
  if [ "$(left)" -lt "$minimum" ]; then
    echo "== $name: skipped, $(left) s left (needs $minimum)" | tee -a "$LOG"; return 0
  fi
  echo "== $name at ${SECONDS} s ($(left) s left): $*" | tee -a "$LOG"
  timeout "$(left)" "$@" 2>&1 | tee -a "$LOG"
  echo "== $name ended at ${SECONDS} s (status ${PIPESTATUS[0]})" | tee -a "$LOG"
}
per_command() { local t; t=$(( ($(left) - 5) / $1 )); [ "$t" -gt 240 ] && t=240; echo "$t"; }

{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  $PY -c "import sys, jax, flax, optax, numpy; print(sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'numpy', numpy.__version__, jax.devices())"
} 2>&1 | tee -a "$LOG"

for name in "${STEPS[@]}"; do
  case $name in
    transformer)
      step transformer 150 $PY bench/gpu_harness.py --workloads transformer --steps 20 --preset "$PRESET" "${SET[@]}" \
        --timeout "$(per_command 2)" --out "$OUT/transformer.csv" --profile "$OUT/profile_transformer.txt" ;;
    efficientnet)
      step efficientnet 120 $PY bench/gpu_harness.py --workloads efficientnet --steps 20 --preset "$PRESET" "${SET[@]}" \
        --variant efficientnet:train.precision=float32 --timeout "$(per_command 3)" \
        --out "$OUT/efficientnet.csv" ;;
    probe)
      step probe 60 $PY bench/nan_probe.py efficientnet --steps 20 --preset "$PRESET" "${SET[@]}" \
        --set train.global_batch_size=128 ;;
    bert_packed)
      step bert_packed 90 $PY run_benchmark.py run bert --framework jax --preset "$PRESET" "${SET[@]}" \
        --steps 20 --seed 0 --set train.global_batch_size=64 --set data.packing=true \
        --results "$OUT/bert_packed.csv" --log-dir "$OUT/logs" ;;
    *) echo "unknown step $name; allowed: transformer efficientnet probe bert_packed" >&2; exit 2 ;;
  esac
done
echo "== done at ${SECONDS} s" | tee -a "$LOG"
