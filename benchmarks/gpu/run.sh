#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU and no network (see README.md here).
#
#   bash benchmarks/gpu/run.sh              from the repository root, with .gpu/ (pack.sh) present
#   bash benchmarks/gpu/run.sh --dry-run    the same on a CPU, with tiny models (~2 minutes)
#
# Nothing is compiled here: the CUDA wheel pack.sh carried is installed (seconds); the random-weight
# models are written; check.py measures within CHECK_BUDGET (it starts nothing new after it) and is
# killed at CHECK_LIMIT; report.py writes RESULTS.md. Everything goes to $OUT (default /tmp/gpu-out):
# run.log, results.json, RESULTS.md, selftest.json, selftest-invariant.json, models.log, curve-models.log,
# step-overhead.json, graphs.json, kernels.json. About 7.5 minutes in all with the defaults (the step-overhead bench takes at
# most OVERHEAD_LIMIT, 90 s; graphs.py at most GRAPHS_LIMIT, 60 s; kernels.py at most KERNELS_LIMIT, 70 s).
set -uo pipefail

DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT=${OUT:-$([ $DRY = 1 ] && echo /tmp/gpu-dry || echo /tmp/gpu-out)}
WORKDIR=${GPU_WORKDIR:-/tmp/localspec-gpu}
CHECK_BUDGET=${CHECK_BUDGET:-$([ $DRY = 1 ] && echo 150 || echo 180)}   # seconds: no new measurement after
CHECK_LIMIT=${CHECK_LIMIT:-$([ $DRY = 1 ] && echo 300 || echo 280)}    # ... and killed after this
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PACK=$ROOT/.gpu
SITE=$WORKDIR/site
MODELS=$WORKDIR/models
PY=${PY:-python3}
mkdir -p "$OUT" "$SITE" "$MODELS"
exec > >(tee -a "$OUT/run.log") 2>&1
T0=$(date +%s)
say() { echo "[run.sh $(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }
fail() { say "FAILED: $*"; echo "{\"error\": \"$*\"}" > "$OUT/results.json"; exit 1; }

cd "$ROOT"
[ -d "$PACK" ] || fail "no .gpu/ in $ROOT: run benchmarks/gpu/pack.sh where there is network and carry .gpu"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,compute_cap --format=csv
say "python: $($PY --version 2>&1); packed at $(head -1 "$PACK/COMMIT" 2>/dev/null || echo '?')"
[ -f "$PACK/BUILD.txt" ] && sed 's/^/  build: /' "$PACK/BUILD.txt"

# --- 1. the wheels: llama-cpp-python (CUDA, built by scripts/setup.sh), and what the machine lacks --
export PYTHONPATH=$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}
SITE_TAR=$(ls "$PACK"/llama_cpp_python-*-site.tar.xz 2>/dev/null | head -1)
[ -n "$SITE_TAR" ] || fail "no llama_cpp_python-*-site.tar.xz in .gpu/ (pack.sh)"
rm -rf "$SITE"/llama_cpp "$SITE"/llama_cpp_python-*.dist-info
xz -dc "$SITE_TAR" | tar -C "$SITE" -xf - || fail "cannot unpack $(basename "$SITE_TAR")"
say "llama-cpp-python unpacked into $SITE from $(basename "$SITE_TAR")"
need=()
$PY -c "import gguf" 2>/dev/null || need+=("$PACK"/wheels/gguf-*.whl)
$PY -c "import diskcache" 2>/dev/null || need+=("$PACK"/wheels/diskcache-*.whl)
$PY -c "import yaml" 2>/dev/null || need+=("$PACK"/wheels/[Pp]y[Yy][Aa][Mm][Ll]-*.whl)
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]##*/} into $SITE"
  timeout 120 $PY -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$SITE" "${need[@]}" \
    || fail "wheel install"
fi
# libggml-cuda.so's RUNPATH is $ORIGIN: as scripts/setup.sh does, link the CUDA runtime and cuBLAS in
# beside it, here from the CUDA wheels beside PyTorch (nvidia/cu13/lib) or a CUDA 13 toolkit.
if ls "$SITE"/llama_cpp/lib/libggml-cuda.so* >/dev/null 2>&1; then
  SITES=$($PY -c "import site; print(' '.join(site.getsitepackages()))" 2>/dev/null)
  for so in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
    found=""
    for d in $(for p in $SITES; do echo "$p/nvidia/cu13/lib"; done) /usr/local/cuda/lib64 \
             /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu \
             "$HOME"/.cache/localspec/cuda-13.*/nvidia/cu13/lib; do   # the last: setup.sh's, for a dry run
      [ -e "$d/$so" ] && { found=$d/$so; break; }
    done
    [ -n "$found" ] || fail "no $so here (the nvidia-cublas and nvidia-cuda-runtime wheels, or a CUDA 13 toolkit)"
    ln -sf "$(readlink -f "$found")" "$SITE/llama_cpp/lib/$so"
    say "$so: $found"
  done
fi
$PY -c "from localspec import backend; print('gpu offload:', backend.gpu_offload_supported(), backend.gpu_devices()); print(backend.system_info())" \
    || fail "llama_cpp does not import"
say "installed"

# --- 2. the random-weight models (gguf + numpy only), three writers side by side ----------------------
TINY=$([ $DRY = 1 ] && echo --tiny)
say "writing the random-weight models to $MODELS"
rm -f "$MODELS"/*.gguf "$MODELS"/*.partial
pids=()
for part in target draft mtp; do
  ( timeout 240 $PY benchmarks/gpu/make_models.py "$MODELS" $TINY --only $part >> "$OUT/models.log" 2>&1 ) &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || fail "make_models.py (see models.log)"; done
cat "$OUT/models.log"

# --- 3. the self-test on the GPU (what `localspec doctor --smoke-only` runs after setup) ---------------
TARGET=$MODELS/$([ $DRY = 1 ] && echo target-tiny.gguf || echo target-8b.gguf)
timeout 120 $PY -m localspec.backend.selftest "$TARGET" > "$OUT/selftest.json" 2> "$WORKDIR/selftest.err" \
  || { tail -5 "$WORKDIR/selftest.err"; say "self-test FAILED (exit $?)"; }
$PY -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]; t=[x['selftest'] for x in r if 'selftest' in x]; print('self-test:', t[0] if t else 'none')" "$OUT/selftest.json"
# ... and under our batch-invariant switch (70-cuda-batch-invariant-switch.patch; #40 item 2): the build says
# CUDA_BATCH_INVARIANT = 1, a verification holds 8 rows, compared bit for bit with one-token decodes (~20 s)
LOCALSPEC_CUDA_BATCH_INVARIANT=1 timeout 120 $PY -m localspec.backend.selftest "$TARGET" > "$OUT/selftest-invariant.json" \
  2> "$WORKDIR/selftest-invariant.err" || { tail -5 "$WORKDIR/selftest-invariant.err"; say "invariant self-test FAILED (exit $?)"; }
$PY -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]; b=[x['build'].get('cuda_batch_invariant') for x in r if 'build' in x]; t=[x['selftest'] for x in r if 'selftest' in x]; print('self-test, batch-invariant switch', b[0] if b else '?', ':', t[0] if t else 'none')" "$OUT/selftest-invariant.json"

# --- 4. the check ---------------------------------------------------------------------------------
CURVES=$([ $DRY = 1 ] && echo "tiny-k:Q4_K_M,tiny-k:Q8_0" || echo "8b:Q8_0,27b:Q4_K_M,27b:Q8_0")
EXTRA=()
[ $DRY = 1 ] && EXTRA=(--tiny --max-tokens 24 --rounds 1 --cost-budget-s 0.3 --ctx 1100 --exact-n 3 --exact-tokens 24)
say "running check.py (budget ${CHECK_BUDGET}s, limit ${CHECK_LIMIT}s)"
timeout "$CHECK_LIMIT" $PY benchmarks/gpu/check.py "$MODELS" --out "$OUT/results.json" --budget-s "$CHECK_BUDGET" \
  --curve-models "$CURVES" "${EXTRA[@]}"
rc=$?
say "check.py exited with $rc; results in $OUT/results.json"
[ -f "$OUT/curve-models.log" ] && cat "$OUT/curve-models.log"

# --- 4b. what the engine costs between decodes, beside raw llama.cpp calls on the same contexts ---------
# (plain, ngram with nothing to copy, a k = 4 self-draft: benchmarks/bench_step_overhead.py, about a minute)
OVERHEAD=$([ $DRY = 1 ] && echo "--tokens 48 --rounds 2" || echo "--tokens 128 --rounds 3")
say "running bench_step_overhead.py on $(basename "$TARGET")"
timeout "${OVERHEAD_LIMIT:-90}" $PY benchmarks/bench_step_overhead.py "$TARGET" --gpu-layers -1 $OVERHEAD \
  --json "$OUT/step-overhead.json" || say "bench_step_overhead.py did not finish (exit $?)"

# --- 4c. CUDA graphs across speculation's shapes: ggml-cuda's graphs keyed by address (upstream) or by shape --
# (benchmarks/gpu/graphs.py: one-token decodes and k + 1 row batches, steady and alternating; ~30 s)
GRAPHS=$([ $DRY = 1 ] && echo "--n 8" || echo "--n 48")
say "running graphs.py on $(basename "$TARGET")"
timeout "${GRAPHS_LIMIT:-60}" $PY benchmarks/gpu/graphs.py "$TARGET" $GRAPHS --json "$OUT/graphs.json" \
  || say "graphs.py did not finish (exit $?)"

# --- 4d. which kernels make a verification batch cheap, and which keep it exact: ggml's choice, MMQ from
# 2 columns, the batch-invariant switch (benchmarks/gpu/kernels.py, LOCALSPEC_CUDA_MMVQ_COLS and
# LOCALSPEC_CUDA_BATCH_INVARIANT; batches of 1-16 rows, six processes; ~40 s; #40 items 1, 2 and 4)
KERNELS=$([ $DRY = 1 ] && echo "--n 6" || echo "--n 16")
say "running kernels.py on $(basename "$TARGET")"
timeout "${KERNELS_LIMIT:-70}" $PY benchmarks/gpu/kernels.py "$TARGET" $KERNELS --json "$OUT/kernels.json" \
  || say "kernels.py did not finish (exit $?)"
# --- 5. RESULTS.md --------------------------------------------------------------------------------------
timeout 120 $PY benchmarks/gpu/report.py "$OUT/results.json" --out "$OUT/RESULTS.md" \
  --step-overhead "$OUT/step-overhead.json" --graphs "$OUT/graphs.json" --kernels "$OUT/kernels.json" \
  --commit "$(head -1 "$PACK/COMMIT" 2>/dev/null)" $([ $DRY = 1 ] && echo --dry-run) || say "report.py failed (rerun it on results.json)"
rm -f "$MODELS"/curve-*.gguf
say "done"
exit $rc
