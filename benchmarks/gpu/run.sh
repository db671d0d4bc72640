#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU and no network (see README.md here).
#
#   bash benchmarks/gpu/run.sh          from the repository root, with .gpu/ (pack.sh) present
#
# Phases, each with a wall-clock limit: install the carried wheels; build llama-cpp-python with
# CUDA for this GPU's architecture only (meanwhile write the random-weight models); run check.py.
# Everything goes to $OUT (default /tmp/gpu-out): run.log, build.log (tail), models.log, results.json.
set -uo pipefail

OUT=${OUT:-/tmp/gpu-out}
WORKDIR=${GPU_WORKDIR:-/tmp/localspec-gpu}
BUILD_LIMIT=${BUILD_LIMIT:-330}     # seconds
CHECK_BUDGET=${CHECK_BUDGET:-120}   # check.py starts no new measurement after this
CHECK_LIMIT=${CHECK_LIMIT:-200}     # ... and is killed after this
JOBS=${JOBS:-$(nproc)}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PACK=$ROOT/.gpu
SITE=$WORKDIR/site
MODELS=$WORKDIR/models
mkdir -p "$OUT" "$SITE" "$MODELS"
exec > >(tee -a "$OUT/run.log") 2>&1
T0=$(date +%s)
say() { echo "[run.sh $(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }
fail() { say "FAILED: $*"; echo "{\"error\": \"$*\"}" > "$OUT/results.json"; exit 1; }

cd "$ROOT"
[ -d "$PACK" ] || fail "no .gpu/ in $ROOT: run benchmarks/gpu/pack.sh where there is network and carry .gpu"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,compute_cap --format=csv
PY=python3
say "python: $($PY --version 2>&1), cmake: $(cmake --version | head -1), nvcc: $(nvcc --version | tail -1)"

# --- 1. wheels the machine lacks (only those whose import fails) ---------------------------
export PYTHONPATH=$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}
need=()
$PY -c "import gguf" 2>/dev/null || need+=("$PACK"/wheels/gguf-*.whl)
$PY -c "import diskcache" 2>/dev/null || need+=("$PACK"/wheels/diskcache-*.whl)
$PY -c "import yaml" 2>/dev/null || need+=("$PACK"/wheels/[Pp]y[Yy][Aa][Mm][Ll]-*.whl)
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]##*/} into $SITE"
    timeout 120 $PY -m pip install --quiet --no-index --no-deps --target "$SITE" "${need[@]}" || fail "wheel install"
fi
$PY -c "import gguf, diskcache, numpy, jinja2" || fail "python dependencies missing"

# --- 2. llama-cpp-python with CUDA, for this GPU only -----------------------------------------
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
ARCH=${CUDA_ARCH:-${CAP:-90}}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
extra=""
# ggml-cuda links cuBLAS (no way around it); say so at once rather than after minutes of compiling.
if ! ls "$CUDA_HOME"/lib64/libcublas.so* "$CUDA_HOME"/targets/*/lib/libcublas.so* /usr/lib/x86_64-linux-gnu/libcublas.so* >/dev/null 2>&1; then
    fail "cuBLAS not found under $CUDA_HOME (ggml-cuda needs libcublas); install the CUDA toolkit's cuBLAS"
fi
# Without an unversioned libcuda.so to link, build without CUDA VMM (a memory-pool detail).
if ! ls "$CUDA_HOME"/lib64/libcuda.so "$CUDA_HOME"/lib64/stubs/libcuda.so "$CUDA_HOME"/targets/*/lib/stubs/libcuda.so \
        /usr/lib/x86_64-linux-gnu/libcuda.so /usr/lib64/libcuda.so >/dev/null 2>&1; then
    extra="-DGGML_CUDA_NO_VMM=ON"
    say "no libcuda.so to link against: building with GGML_CUDA_NO_VMM"
fi
# --- 3. models in the background (only gguf + numpy: no llama.cpp needed) -------------------
say "writing the random-weight models to $MODELS (background)"
( timeout 300 nice -n 5 $PY benchmarks/gpu/make_models.py "$MODELS" > "$OUT/models.log" 2>&1; echo $? > "$WORKDIR/models.rc" ) &
MODELS_PID=$!

# --- 4. the build
SDIST=$(ls "$PACK"/llama_cpp_python-*-trimmed.tar.gz | head -1)
export CMAKE_ARGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCH -DLLAVA_BUILD=OFF -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=ON $extra"
export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
say "building $(basename "$SDIST") with CMAKE_ARGS=$CMAKE_ARGS, $JOBS jobs, limit ${BUILD_LIMIT}s"
timeout "$BUILD_LIMIT" $PY -m pip install -v --no-index --no-deps --no-build-isolation --target "$SITE" "$SDIST" \
    > "$WORKDIR/build.log" 2>&1
rc=$?
tail -c 400000 "$WORKDIR/build.log" > "$OUT/build.log"
[ $rc -eq 0 ] || { tail -40 "$WORKDIR/build.log"; fail "llama-cpp-python build (rc $rc; 124 = over ${BUILD_LIMIT}s)"; }
say "build done"
$PY -c "from localspec import backend; print('gpu offload:', backend.gpu_offload_supported()); print(backend.system_info())" \
    || fail "llama_cpp does not import"

# --- 5. the check ---------------------------------------------------------------------------------
wait "$MODELS_PID"
cat "$OUT/models.log"
[ "$(cat "$WORKDIR/models.rc")" = 0 ] || fail "make_models.py"
say "running check.py (budget ${CHECK_BUDGET}s, limit ${CHECK_LIMIT}s)"
timeout "$CHECK_LIMIT" $PY benchmarks/gpu/check.py "$MODELS" --out "$OUT/results.json" --budget-s "$CHECK_BUDGET"
rc=$?
say "check.py exited with $rc; results in $OUT/results.json"
exit $rc
