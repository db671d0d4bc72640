#!/usr/bin/env bash
# Links the CUDA runtime and cuBLAS of a toolkit into a folder (llama_cpp/lib), for setup.sh and
# benchmarks/gpu/pack.sh: llama-cpp-python links its libraries with RUNPATH $ORIGIN alone, so
# libggml-cuda.so finds them only beside itself. No LD_LIBRARY_PATH, no preloading.
#
#   scripts/link-cuda-libs.sh LIBDIR CUDA_ROOT MAJOR      e.g. .../llama_cpp/lib ~/.cache/.../cu13 13
#
# Each library is taken from the first of lib64/, lib/, targets/*/lib/ that has it; one missing
# everywhere is one line naming it and exit 1.
set -euo pipefail
LIBDIR=$1 CUDA_ROOT=$2 MAJOR=$3
for so in libcudart libcublas libcublasLt; do
  found=""
  for candidate in "$CUDA_ROOT"/lib64/$so.so.$MAJOR "$CUDA_ROOT"/lib/$so.so.$MAJOR "$CUDA_ROOT"/targets/*/lib/$so.so.$MAJOR; do
    [ -e "$candidate" ] && { found=$candidate; break; }
  done
  [ -n "$found" ] || { echo "setup.sh: $so.so.$MAJOR is not in the CUDA toolkit at $CUDA_ROOT: reinstall its runtime and cuBLAS (or LOCALSPEC_CUDA_TOOLKIT=wheels)" >&2; exit 1; }
  ln -sf "$(readlink -f "$found")" "$LIBDIR/$so.so.$MAJOR"
done
