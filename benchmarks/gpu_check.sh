#!/usr/bin/env bash
# The GPU checks in one prepared run, for a machine with an NVIDIA GPU (docs/gpu.md, "On a GPU machine").
# Run from the repository root:  OUT=DIR bash benchmarks/gpu_check.sh   (PY=python3 by default)
# Steps, each bounded, each logging to $OUT: the machine and packages; the launch layer's probe and a
# one-kernel NVRTC compile (if the installed CUDA headers are not found, the pinned header wheels in .whl/
# are installed and the probe repeated); `tileweave run --backend cuda` as a new user types it; the gpu-marked
# tests (every sample x policy against onnxruntime, the persistent kernel, a second thread, a bundle); the
# zoo's kernels timed against the cost model (benchmarks/bench_cost_model.py --device gpu); hardware
# traffic under Nsight Compute for three zoo models (benchmarks/gpu_counters.py), per kernel with cold caches,
# then whole programs with caches warm between kernels (the L2 residency model, engine/schedule/residency.py).
# STEPS picks which of "cli tests bench counters tune program" run (default all, in that order); *_S
# variables bound each step; PLANS, POLICIES, JOBS, TEST_JOBS, COUNTER_MODELS, PROGRAM_MODELS, TUNE_MODELS tune them.
set -u
STEPS=${STEPS:-cli tests bench counters tune program}
want() { [[ " $STEPS " == *" $1 "* ]]; }
OUT=${OUT:-/tmp/gpu_check}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TILEWEAVE_CACHE=${TILEWEAVE_CACHE:-/tmp/tileweave-cache}
STORE=/tmp/tileweave-store
JOBS=${JOBS:-$(( $(nproc) > 2 ? $(nproc) - 2 : 1 ))}
t0=$(date +%s)
step() { echo "== $1 (t=$(( $(date +%s) - t0 )) s)"; }

step env | tee "$OUT/env.txt"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv; nproc; $PY -V
  $PY -m pip list 2>/dev/null | grep -iE "^(cuda|nvidia-cuda|onnx|numpy|ml.dtypes|pytest|hypothesis|cloudpickle)"
} >> "$OUT/env.txt" 2>&1
probe() {
  $PY - <<'PYEOF'
from engine.runtime.cuda_driver import require_cuda
from engine.codegen.nvrtc import include_dirs, nvrtc_version, compile_cuda
print("GPU:", require_cuda(), "| NVRTC", nvrtc_version(), "| headers", include_dirs())
b = compile_cuda('extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }', name="probe", arch="sm_90", use_cache=False)
print("probe kernel compiled:", len(b.cubin), "B of CUBIN")
import io, numpy as np
buf = io.BytesIO(); np.savez(buf, w=np.arange(6, dtype=np.float32).reshape(2, 3)); buf.seek(0)
try:
    with np.load(buf) as d: print("numpy", np.__version__, "np.savez -> np.load round trip:", d["w"].shape)
except Exception as e:
    print("numpy", np.__version__, "np.savez -> np.load round trip FAILED:", " ".join(str(e).split()))
PYEOF
}
if ! probe >> "$OUT/env.txt" 2>&1; then
  echo "probe failed with the installed packages; installing the pinned header wheels (.whl/)" >> "$OUT/env.txt"
  $PY -m pip install -q --no-index --no-deps --no-compile .whl/*.whl >> "$OUT/env.txt" 2>&1
  probe >> "$OUT/env.txt" 2>&1 || { tail -20 "$OUT/env.txt"; echo "GPU probe failed"; exit 1; }
fi
tail -3 "$OUT/env.txt"

# The zoo's plans and NVRTC builds are CPU work: they run in the background while the CLI and the tests use
# the GPU, and the timing waits for them (so nothing else runs on the GPU while kernels are timed). PLANS
# (a folder of MODEL.POLICY.json, or a .tar.gz of one, written by `tileweave plan --plan-out` for the same
# preset) skips the planning; models without a saved plan are planned there.
if [ -n "${PLANS:-}" ] && [ -f "$PLANS" ]; then mkdir -p /tmp/plans && tar xzf "$PLANS" -C /tmp/plans && PLANS=/tmp/plans; fi
if want bench; then
  step "zoo: plans and NVRTC builds (background)" | tee "$OUT/prepare.log"
  timeout ${PREP_S:-200} $PY benchmarks/bench_cost_model.py --device gpu --step prepare --jobs "$JOBS" \
    --timeout 240 --store "$STORE" ${PLANS:+--plans "$PLANS"} ${POLICIES:+--policies "$POLICIES"} >> "$OUT/prepare.log" 2>&1 &
  prep_pid=$!
fi

if want cli; then
  step "tileweave run --backend cuda" | tee "$OUT/cli.log"
  timeout ${CLI_S:-60} $PY -m engine run samples/bert_layer.onnx --backend cuda --profile 5 --outputs /tmp/out.npz >> "$OUT/cli.log" 2>&1
  echo "rc=$?" >> "$OUT/cli.log"
  timeout ${CLI_S:-60} $PY -m engine run samples/gelu_chain.onnx --backend cuda --tune 2 --outputs /tmp/out2.npz >> "$OUT/cli.log" 2>&1
  echo "rc=$?" >> "$OUT/cli.log"
  tail -12 "$OUT/cli.log"
fi

if want tests; then
  step "pytest -m gpu" | tee "$OUT/pytest_gpu.log"
  # 57 tests, ~110 s on 12 workers of an H200 machine with nothing else running (bert12's cells take 29-90 s each)
  timeout ${TESTS_S:-200} $PY -m pytest -q -p no:cacheprovider -m gpu -rs -n "${TEST_JOBS:-$JOBS}" tests/engine/runtime/test_cuda.py ${TESTS_K:+-k "$TESTS_K"} \
    >> "$OUT/pytest_gpu.log" 2>&1
  echo "rc=$?" >> "$OUT/pytest_gpu.log"
  for f in "$TILEWEAVE_CACHE"/nvrtc/failed/*.log; do [ -e "$f" ] && { echo "-- $f"; head -5 "$f"; } >> "$OUT/pytest_gpu.log"; done
  grep -E "^(FAILED|ERROR)|passed|failed|^-- " "$OUT/pytest_gpu.log" | tail -15
fi

if want bench; then
  step "zoo: waiting for the plans and builds" | tee -a "$OUT/prepare.log"
  wait $prep_pid; echo "rc=$?" >> "$OUT/prepare.log"
  grep -E "prepared|failed|timed out|error|rc=" "$OUT/prepare.log" | tail -16
  step "zoo: modeled vs measured" | tee "$OUT/bench.log"
  timeout ${BENCH_S:-220} $PY benchmarks/bench_cost_model.py --device gpu --step time --runs 7 --timeout 240 \
    --store "$STORE" ${POLICIES:+--policies "$POLICIES"} --json "$OUT/bench.json" >> "$OUT/bench.log" 2>&1
  echo "rc=$?" >> "$OUT/bench.log"
  tail -22 "$OUT/bench.log"
fi

if want counters; then
  step "Nsight Compute counters" | tee "$OUT/counters.log"
  timeout ${COUNTERS_S:-120} $PY benchmarks/gpu_counters.py --store "$STORE" --models ${COUNTER_MODELS:-bert,convnext,mobilevit} \
    --policies welder,stitch --timeout 60 --json "$OUT/counters.json" >> "$OUT/counters.log" 2>&1
  echo "rc=$?" >> "$OUT/counters.log"
  grep -E "all |rc=|error|failed" "$OUT/counters.log" | tail -8
fi

if want tune; then  # Welder's method on the GPU: K candidates per kernel timed through the launch layer
  step "welder --tune on the GPU" | tee "$OUT/tune.log"
  for m in ${TUNE_MODELS:-resnet}; do
    timeout ${TUNE_S:-60} $PY -m engine plan "samples/zoo/$m.onnx" --policy welder --device "${TUNE_DEVICE:-h200}" \
      --tune ${TUNE_K:-3} --json > "$OUT/tune-$m.json" 2>> "$OUT/tune.log"
    echo "$m rc=$?" >> "$OUT/tune.log"
  done
  tail -4 "$OUT/tune.log"
fi

if want program; then
  step "Nsight Compute counters, whole programs, caches warm between kernels" | tee "$OUT/program.log"
  timeout ${PROGRAM_S:-120} $PY benchmarks/gpu_counters.py --store "$STORE" --program --models ${PROGRAM_MODELS:-lstm,nerf,bert} \
    --policies welder,stitch --timeout 60 --json "$OUT/program.json" >> "$OUT/program.log" 2>&1
  echo "rc=$?" >> "$OUT/program.log"
  grep -E "all |rc=|error|failed" "$OUT/program.log" | tail -8
fi

step done
