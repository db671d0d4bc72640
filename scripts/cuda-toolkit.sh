#!/usr/bin/env bash
# Finds a CUDA toolkit that can build ggml-cuda (nvcc and cuBLAS), fetching one from PyPI when
# this machine has none, and prints one line on stdout: "ROOT VERSION" (ROOT holds bin/nvcc,
# include/ and the libraries; VERSION is nvcc's, e.g. 13.0.88). Anything it has to say goes to
# stderr as one line; a failure exits non-zero with what to do.
#
#   LOCALSPEC_CUDA_TOOLKIT=auto     an installed toolkit with cuBLAS if there is one, else the wheels
#   LOCALSPEC_CUDA_TOOLKIT=system   an installed toolkit only (CUDA_HOME, nvcc on PATH, /usr/local/cuda)
#   LOCALSPEC_CUDA_TOOLKIT=wheels   PyPI's toolkit wheels, even where one is installed
#
# The wheels (nvidia-cuda-nvcc, -nvvm, -crt, -runtime, -cccl, nvidia-cublas, all CUDA 13.0: the
# release every driver from 580 on runs) are installed with pip into
# ~/.cache/localspec/cuda-<nvcc version>/, whose nvidia/cu13/ is laid out as a toolkit: nvcc's own
# nvcc.profile finds cicc, the headers and the libraries beside it. CMake's FindCUDAToolkit looks
# for unversioned names (libcublas.so); the wheels ship only the sonames, so links are added.
set -euo pipefail
MODE=${LOCALSPEC_CUDA_TOOLKIT:-auto}
case "$MODE" in auto|system|wheels) ;;
  *) echo "setup.sh: LOCALSPEC_CUDA_TOOLKIT must be auto, system or wheels, not '$MODE'" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
WHEEL_NVCC=13.0.88
WHEEL_SET=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
           nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14)

nvcc_version() { "$1" --version 2>/dev/null | sed -n 's/.*release [0-9.]*, V\([0-9.]*\).*/\1/p' | head -1; }
has_cublas() {
  ls "$1"/lib64/libcublas.so* "$1"/lib/libcublas.so* "$1"/targets/*/lib/libcublas.so* \
     /usr/lib/x86_64-linux-gnu/libcublas.so* /usr/lib/aarch64-linux-gnu/libcublas.so* >/dev/null 2>&1
}

if [ "$MODE" != wheels ]; then
  # The first nvcc whose folder is a toolkit (include/cuda_runtime.h beside bin/): a wrapper
  # script such as /usr/local/bin/nvcc is passed over for the toolkit it points into.
  NVCC=""
  for c in ${CUDA_HOME:+"$CUDA_HOME/bin/nvcc"} ${CUDA_PATH:+"$CUDA_PATH/bin/nvcc"} \
           "$(command -v nvcc 2>/dev/null || true)" /usr/local/cuda/bin/nvcc; do
    [ -n "$c" ] && [ -x "$c" ] || continue
    c=$(readlink -f "$c")
    if [ -e "$(dirname "$(dirname "$c")")/include/cuda_runtime.h" ]; then NVCC=$c; break; fi
  done
  if [ -n "$NVCC" ]; then
    ROOT=$(dirname "$(dirname "$NVCC")")
    VERSION=$(nvcc_version "$NVCC")
    if has_cublas "$ROOT"; then echo "$ROOT $VERSION"; exit 0; fi
    if [ "$MODE" = system ]; then
      APT_VER=$(echo "$VERSION" | cut -d. -f1,2 | tr . -)
      echo "setup.sh: the CUDA toolkit at $ROOT has no cuBLAS, which ggml-cuda links: install it (NVIDIA's apt repository: libcublas-dev-$APT_VER), or set LOCALSPEC_CUDA_TOOLKIT=wheels to fetch CUDA $WHEEL_NVCC from PyPI" >&2
      exit 1
    fi
    echo "setup.sh: the CUDA toolkit at $ROOT has no cuBLAS; using CUDA $WHEEL_NVCC from PyPI instead" >&2
  elif [ "$MODE" = system ]; then
    echo "setup.sh: no CUDA toolkit found (CUDA_HOME, nvcc on PATH, /usr/local/cuda): install one, or set LOCALSPEC_CUDA_TOOLKIT=wheels to fetch it from PyPI" >&2
    exit 1
  fi
fi

CACHE=${LOCALSPEC_CUDA_DIR:-$HOME/.cache/localspec/cuda-$WHEEL_NVCC}
ROOT=$CACHE/nvidia/cu13
if [ ! -x "$ROOT/bin/nvcc" ] || [ ! -e "$CACHE/.complete" ]; then
  echo "setup.sh: no CUDA toolkit with cuBLAS here: fetching CUDA $WHEEL_NVCC's wheels from PyPI into $CACHE (~850 MB on disk, once)" >&2
  rm -rf "$CACHE"
  mkdir -p "$CACHE"
  if ! "$PY" -m pip --disable-pip-version-check --quiet install --no-compile --no-deps \
       --target "$CACHE" "${WHEEL_SET[@]}" >"$CACHE.log" 2>&1; then
    echo "setup.sh: fetching the CUDA toolkit wheels failed (pip's output: $CACHE.log); check the network, or install a CUDA toolkit with cuBLAS" >&2
    rm -rf "$CACHE"
    exit 1
  fi
  for lib in cudart cublas cublasLt; do
    ln -sf "lib$lib.so.13" "$ROOT/lib/lib$lib.so"
  done
  # nvcc.profile links from lib64 (lib$(_TARGET_SIZE_)); the wheels put everything in lib.
  ln -sfn lib "$ROOT/lib64"
  touch "$CACHE/.complete"
fi
echo "$ROOT $(nvcc_version "$ROOT/bin/nvcc")"
