#!/usr/bin/env bash
# Prepare .gpu/: what the GPU machine (no network, Python 3.12, nvcc, CMake) lacks.
#
#   .gpu/llama_cpp_python-0.3.36-trimmed.tar.gz   the sdist without what a CUDA build of the
#                                                 library does not read (75 MB -> ~7 MB)
#   .gpu/wheels/*.whl                             gguf, diskcache, PyYAML (cp312) for an offline install
#
# Run on a machine with PyPI access, from anywhere in the repository:
#   bash benchmarks/gpu/pack.sh            (SDIST=path/to/llama_cpp_python-0.3.36.tar.gz to skip the download)
# .gpu/ is git-ignored through .git/info/exclude and never committed.
set -euo pipefail

VERSION=0.3.36
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
DEST=$ROOT/.gpu
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3

grep -qxF '/.gpu/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >> "$ROOT/.git/info/exclude"
rm -rf "$DEST" && mkdir -p "$DEST/wheels"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# --- the trimmed sdist ------------------------------------------------------------------------
SDIST=${SDIST:-/tmp/sdist/llama_cpp_python-$VERSION.tar.gz}
if [ ! -f "$SDIST" ]; then
    "$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK/dl"
    SDIST=$WORK/dl/llama_cpp_python-$VERSION.tar.gz
fi
tar -xzf "$SDIST" -C "$WORK"
SRC=$WORK/llama_cpp_python-$VERSION
LC=$SRC/vendor/llama.cpp

# The Python package's own extras: docs, CI, examples, tests, the git history of the sdist.
rm -rf "$SRC"/{.git,.github,docs,docker,examples,tests,scripts,mkdocs.yml,CHANGELOG.md,Makefile}
# llama.cpp: vocab GGUFs (75 MB), docs, tests, tools and examples (not built: LLAMA_BUILD_TESTS,
# _EXAMPLES, _TOOLS, _SERVER default to OFF under add_subdirectory), the Python converters.
# tools/mtmd stays: the default LLAVA_BUILD=ON adds it (run.sh turns it off, but keep it buildable).
rm -rf "$LC"/{models,docs,tests,benches,media,examples,pocs,gguf-py,conversion,scripts,app,ci,skills,requirements,grammars,.devops,.github}
rm -f "$LC"/convert_*.py "$LC"/requirements.txt
find "$LC/tools" -mindepth 1 -maxdepth 1 ! -name mtmd ! -name CMakeLists.txt -exec rm -rf {} +
# ggml backends other than CPU and CUDA: ggml_add_backend() only enters a backend's folder when
# its GGML_<NAME> option is on.
for b in opencl vulkan sycl hexagon metal et webgpu openvino cann virtgpu musa zdnn zendnn; do
    rm -rf "$LC/ggml/src/ggml-$b"
done
tar -C "$WORK" -czf "$DEST/llama_cpp_python-$VERSION-trimmed.tar.gz" "llama_cpp_python-$VERSION"

# --- wheels the machine lacks ---------------------------------------------------------------
# gguf and diskcache are pure Python; PyYAML (gguf imports it) in its CPython 3.12 manylinux build,
# installed there only when `import yaml` fails.
"$PY" -m pip download --quiet --no-deps --only-binary :all: -d "$DEST/wheels" \
    "gguf==0.19.0" "diskcache==5.6.3"
"$PY" -m pip download --quiet --no-deps --only-binary :all: --python-version 3.12 --implementation cp \
    --abi cp312 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$DEST/wheels" "PyYAML==6.0.2"

du -ah "$DEST" | sort -h
TOTAL=$(du -sm "$DEST" | cut -f1)
echo "total: ${TOTAL} MiB (limit: 64 MiB of carried files)"
[ "$TOTAL" -lt 60 ] || { echo "pack.sh: .gpu/ is ${TOTAL} MiB, too big" >&2; exit 1; }
