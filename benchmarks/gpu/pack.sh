#!/usr/bin/env bash
# Prepare .gpu/: what the GPU machine (no network, Python 3.12, nvcc 13.0, driver 580) lacks.
#
#   .gpu/llama_cpp_python-*-site.tar.xz  the CUDA wheel scripts/setup.sh built (LOCALSPEC_CUDA=on
#                                    CUDA_ARCH=89,90 ...), unpacked as installed (its package and
#                                    metadata, each library once, the other names as links): compiled
#                                    here, so run.sh installs it in seconds instead of compiling
#                                    ggml-cuda there; xz'd
#   .gpu/BUILD.txt                   how that wheel was built (setup.sh's record)
#   .gpu/COMMIT                      the commit it is packed at (the device gets no .git)
#   .gpu/wheels/*.whl                gguf, diskcache, PyYAML (cp312) for an offline install
#
# Run on a machine with PyPI access, from anywhere in the repository:
#   bash benchmarks/gpu/pack.sh                     the newest CUDA wheel in ~/.cache/localspec/wheels
#   WHEEL=path/to/llama_cpp_python-….whl bash benchmarks/gpu/pack.sh   that one (a CPU wheel: dry runs)
#   ARCH=90 (default) names the architecture the wheel must hold.
# .gpu/ is git-ignored (.gitignore) and never committed; a device call carries it (carry: [".gpu"]).
set -euo pipefail

ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
DEST=$ROOT/.gpu
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
ARCH=${ARCH:-90}
LIMIT_MIB=48   # of the 64 MiB a device call may carry: the repository and the logs need the rest
fail() { echo "pack.sh: $*" >&2; exit 1; }

# --- the wheel -----------------------------------------------------------------------------
if [ -z "${WHEEL:-}" ]; then
  # The newest cached build whose record says CUDA with this architecture.
  for dir in $(ls -td "$HOME"/.cache/localspec/wheels/*/ 2>/dev/null); do
    if grep -qE "^cuda: .*sm_([0-9]+,)*$ARCH\b" "$dir/BUILD.txt" 2>/dev/null; then  # sm_90, sm_89,90
      WHEEL=$(ls "$dir"/llama_cpp_python-*.whl 2>/dev/null | head -1); BUILD_TXT=$dir/BUILD.txt; break
    fi
  done
  [ -n "${WHEEL:-}" ] || fail "no CUDA wheel for sm_$ARCH in ~/.cache/localspec/wheels: build one first with LOCALSPEC_CUDA=on CUDA_ARCH=89,$ARCH scripts/setup.sh (or name one: WHEEL=...)"
fi
[ -f "$WHEEL" ] || fail "$WHEEL: no such wheel"
BUILD_TXT=${BUILD_TXT:-$(dirname "$WHEEL")/BUILD.txt}
# ctypes bindings: the wheel is tagged py3-none-<platform>, so a build made with Python 3.11 installs on 3.12.
case "$(basename "$WHEEL")" in
  *-py3-none-linux_x86_64.whl|*-py3-none-manylinux*_x86_64.whl) ;;
  *) fail "$(basename "$WHEEL") is not a py3-none x86_64 wheel; the GPU machine runs CPython 3.12 on x86_64" ;;
esac

rm -rf "$DEST" && mkdir -p "$DEST/wheels"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# A CUDA wheel must hold machine code for the GPU there: ggml-cuda says which (ARCHS, from
# __CUDA_ARCH_LIST__) in llama.cpp's system line, also on a machine without a GPU or driver.
mkdir -p "$WORK/site"
unzip -q "$WHEEL" -d "$WORK/site"
# One copy of each library. A wheel cannot hold symlinks, so this one carries libX.so, libX.so.0 and
# libX.so.0.25.3 as three full copies, and all of them again under a top-level lib/ (with include/)
# that nothing loads from: six copies of a 57 MB libggml-cuda, 79 MiB after xz. Only the package and
# its metadata are packed, each library once (its soname, libX.so.0) with the other names as links.
rm -rf "$WORK/site/lib" "$WORK/site/include" "$WORK/site/bin"
for keep in "$WORK"/site/llama_cpp/lib/lib*.so.[0-9]; do
  [ -f "$keep" ] || continue
  base=${keep%.so.*}
  for other in "$base.so" "$base".so.[0-9]*.*; do
    if [ -f "$other" ] && [ ! -L "$other" ] && cmp -s "$keep" "$other"; then
      ln -sf "$(basename "$keep")" "$other"
    fi
  done
done
# Its RUNPATH is $ORIGIN: link in the CUDA libraries of the toolkit it was built with (BUILD.txt), as
# setup.sh does, so it imports here.
TOOLKIT=$(sed -n 's/^cuda: .*(\(.*\))$/\1/p' "$BUILD_TXT" 2>/dev/null)
CUDA_MAJOR=$(sed -n 's/^cuda: \([0-9]*\)\..*/\1/p' "$BUILD_TXT" 2>/dev/null)
if [ -n "$TOOLKIT" ] && [ -n "$CUDA_MAJOR" ]; then
  "$ROOT/scripts/link-cuda-libs.sh" "$WORK/site/llama_cpp/lib" "$TOOLKIT" "$CUDA_MAJOR"
fi
INFO=$(cd "$WORK" && "$PY" -c "import sys; sys.path.insert(0, 'site'); import llama_cpp; print(llama_cpp.llama_print_system_info().decode())" 2>/dev/null) \
  || fail "$(basename "$WHEEL") does not import here (run scripts/setup.sh with the same options first)"
ARCHS=$(echo "$INFO" | sed -n 's/.*CUDA : ARCHS = \([0-9,]*\).*/\1/p')
if [ -n "$ARCHS" ]; then
  echo "CUDA wheel: $(basename "$WHEEL"), machine code for ARCHS = $ARCHS (890: sm_89, 900: sm_90)"
  case ",$ARCHS," in *",${ARCH}0,"*) ;; *) fail "$(basename "$WHEEL") has no sm_$ARCH code (ARCHS = $ARCHS)" ;; esac
else
  echo "pack.sh: $(basename "$WHEEL") has no CUDA backend: packing it for a dry run only" >&2
fi
# The CUDA links above point into this machine's toolkit: run.sh makes its own there.
find "$WORK/site/llama_cpp/lib" -name 'libcu*.so.*' -type l -delete
SITE_TAR=$(basename "$WHEEL" .whl)-site.tar.xz
tar -C "$WORK/site" -cf - llama_cpp $(cd "$WORK/site" && ls -d llama_cpp_python-*.dist-info) | xz -T0 -9 > "$DEST/$SITE_TAR"
[ -f "$BUILD_TXT" ] && cp "$BUILD_TXT" "$DEST/BUILD.txt"
git -C "$ROOT" rev-parse HEAD > "$DEST/COMMIT"
git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo "(with uncommitted changes)" >> "$DEST/COMMIT"

# --- wheels the machine lacks ---------------------------------------------------------------
# gguf and diskcache are pure Python; PyYAML (gguf imports it) in its CPython 3.12 manylinux build,
# installed there only when `import yaml` fails.
"$PY" -m pip download --quiet --no-deps --only-binary :all: -d "$DEST/wheels" \
    "gguf==0.19.0" "diskcache==5.6.3"
"$PY" -m pip download --quiet --no-deps --only-binary :all: --python-version 3.12 --implementation cp \
    --abi cp312 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$DEST/wheels" "PyYAML==6.0.2"

du -ah "$DEST" | sort -h
TOTAL=$(du -sm "$DEST" | cut -f1)
echo "total: ${TOTAL} MiB (at most $LIMIT_MIB of the 64 MiB a device call carries)"
[ "$TOTAL" -le "$LIMIT_MIB" ] || fail ".gpu/ is ${TOTAL} MiB, too big to carry with the repository"
