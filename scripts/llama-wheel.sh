#!/usr/bin/env bash
# Build llama-cpp-python once, PORTABLE (no -march=native), into a local wheelhouse, and install it
# into the active Python environment.
#
# Why: llama-cpp-python ships no wheel on PyPI, and pip compiles llama.cpp with -march=native. A
# build made on a CPU that advertises AVX-512/AMX dies with SIGILL on a VM whose hypervisor traps
# those instructions (seen: `tileloadd` in libggml-cpu.so), and pip's wheel cache then hands that
# build to every later venv. This script builds the AVX2 baseline on x86-64 (SSE4.2, AVX, AVX2,
# FMA, F16C, BMI2; no AVX-512, no AMX) and the generic ARMv8 baseline on arm64 (Metal stays on for
# Apple silicon), never from pip's cache, and keys the wheelhouse by version, arch and flags.
#
#   bash scripts/llama-wheel.sh            # build if needed, then install into the active env
#   bash scripts/llama-wheel.sh --build    # build only; prints the wheel's path
#   PREFIX_EDGE_LLAMA_NATIVE=1 bash scripts/llama-wheel.sh   # opt in to a -march=native build
#
# The wheel is built from llama-cpp-python's source distribution, which carries llama.cpp's own
# HF -> GGUF converter of the same llama.cpp version (vendor/llama.cpp/convert_hf_to_gguf.py,
# conversion/, gguf-py/); those files are kept next to the wheel, in $HOUSE/llama.cpp/, where
# `prefix-edge export` runs them (prefix_edge/export/llama_convert.py).
set -euo pipefail

VERSION="${PREFIX_EDGE_LLAMA_VERSION:-0.3.36}"
ARCH="$(uname -m)"
PY="${PYTHON:-python}"
CMAKE_FLAGS="-DLLAVA_BUILD=OFF"
if [[ "${PREFIX_EDGE_LLAMA_NATIVE:-0}" == "1" ]]; then
    FLAVOUR="native"
    CMAKE_FLAGS="$CMAKE_FLAGS -DGGML_NATIVE=ON"
else
    FLAVOUR="portable"
    CMAKE_FLAGS="$CMAKE_FLAGS -DGGML_NATIVE=OFF"
    case "$ARCH" in
        x86_64|amd64)
            CMAKE_FLAGS="$CMAKE_FLAGS -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
            CMAKE_FLAGS="$CMAKE_FLAGS -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
            ;;
    esac
fi
CMAKE_FLAGS="$CMAKE_FLAGS ${PREFIX_EDGE_LLAMA_CMAKE_ARGS:-}"
KEY="$(printf '%s' "$VERSION $ARCH $CMAKE_FLAGS" | sha256sum | cut -c1-12)"
ROOT="${PREFIX_EDGE_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/prefix-edge/wheelhouse}"
HOUSE="$ROOT/llama-cpp-python-$VERSION-$ARCH-$FLAVOUR-$KEY"

wheel_path() { ls "$HOUSE"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -n1; }

fetch_sdist() {  # $1: a directory; prints the sdist's path
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$1" >&2
    ls "$1"/llama_cpp_python-"$VERSION".tar.gz
}

keep_converter() {  # $1: the sdist, $2: the house; llama.cpp's converter files into $2/llama.cpp
    local x
    x="$(mktemp -d "$ROOT/.conv-XXXXXX")"
    tar -xzf "$1" -C "$x" --wildcards "*/vendor/llama.cpp/convert_hf_to_gguf.py" \
        "*/vendor/llama.cpp/conversion/*" "*/vendor/llama.cpp/gguf-py/*" "*/vendor/llama.cpp/LICENSE"
    rm -rf "$2/llama.cpp"
    mv "$x"/llama_cpp_python-"$VERSION"/vendor/llama.cpp "$2/llama.cpp"
    rm -rf "$x"
}

if [[ -z "$(wheel_path)" ]]; then
    echo "llama-wheel: building llama-cpp-python $VERSION ($FLAVOUR, $ARCH) into $HOUSE" >&2
    echo "llama-wheel: CMAKE_ARGS=$CMAKE_FLAGS (takes 5-10 min on 2 cores, once)" >&2
    mkdir -p "$ROOT"
    TMP="$(mktemp -d "$ROOT/.build-XXXXXX")"
    trap 'rm -rf "$TMP"' EXIT
    SDIST="$(fetch_sdist "$TMP/sdist")"
    CMAKE_ARGS="$CMAKE_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || echo 2)" \
        "$PY" -m pip wheel --quiet --no-cache-dir --no-deps "$SDIST" -w "$TMP"
    printf '%s\n' "$CMAKE_FLAGS" > "$TMP/CMAKE_ARGS"
    keep_converter "$SDIST" "$TMP"
    rm -rf "$TMP/sdist"
    rm -rf "$HOUSE"
    mv "$TMP" "$HOUSE"
    trap - EXIT
elif [[ ! -f "$HOUSE/llama.cpp/convert_hf_to_gguf.py" ]]; then  # a wheelhouse from before the converter was kept
    echo "llama-wheel: keeping llama.cpp's converter of $VERSION in $HOUSE/llama.cpp" >&2
    TMP="$(mktemp -d "$ROOT/.sdist-XXXXXX")"
    trap 'rm -rf "$TMP"' EXIT
    keep_converter "$(fetch_sdist "$TMP")" "$HOUSE"
    rm -rf "$TMP"
    trap - EXIT
fi
WHEEL="$(wheel_path)"
if [[ "${1:-}" == "--build" ]]; then
    echo "$WHEEL"
    exit 0
fi
# --force-reinstall --no-deps replaces a native build an older install may have left in this env;
# the second call installs the wheel's own dependencies.
"$PY" -m pip install --quiet --force-reinstall --no-deps "$WHEEL"
"$PY" -m pip install --quiet "$WHEEL"
echo "llama-wheel: installed $WHEEL" >&2
