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
#   PREFIX_EDGE_LLAMA_TARGET=aarch64 bash scripts/llama-wheel.sh --build   # cross-build the arm64 wheel
#
# The cross build (an x86-64 Linux host, a linux_aarch64 wheel) uses Debian's gcc-aarch64-linux-gnu /
# g++-aarch64-linux-gnu (installed with apt-get when run as root and missing), a CMake toolchain file
# and the same portable flags and key as a native arm64 build, so both land in the same wheelhouse.
# The libraries carry an $ORIGIN RUNPATH (they find each other in llama_cpp/lib/). ggml links GNU
# OpenMP: the wheel carries libgomp.so.1 there too (carry_libgomp), so a minimal OS image without
# libgomp1 runs it; libstdc++6 (which apt itself needs) is the one library left to the system.
#
# The wheel is built from llama-cpp-python's source distribution, which carries llama.cpp's own
# HF -> GGUF converter of the same llama.cpp version (vendor/llama.cpp/convert_hf_to_gguf.py,
# conversion/, gguf-py/); those files are kept next to the wheel, in $HOUSE/llama.cpp/, where
# `prefix-edge export` runs them (prefix_edge/export/llama_convert.py).
set -euo pipefail

VERSION="${PREFIX_EDGE_LLAMA_VERSION:-0.3.36}"
ARCH="$(uname -m)"
PY="${PYTHON:-python}"
CROSS=""  # the target's arch when cross-building, else empty
case "${PREFIX_EDGE_LLAMA_TARGET:-}" in
    ""|"$ARCH") ;;
    aarch64|arm64)
        if [[ "$ARCH" == "aarch64" ]]; then :
        elif [[ "$(uname -s)" == "Linux" && "$ARCH" == "x86_64" ]]; then CROSS="aarch64"; ARCH="aarch64"
        else echo "llama-wheel: PREFIX_EDGE_LLAMA_TARGET=aarch64 cross-builds on an x86_64 Linux host only (this host: $(uname -s) $ARCH)" >&2; exit 2
        fi ;;
    *) echo "llama-wheel: PREFIX_EDGE_LLAMA_TARGET must be aarch64 (or this host's $ARCH), not '${PREFIX_EDGE_LLAMA_TARGET}'" >&2; exit 2 ;;
esac
if [[ -n "$CROSS" && "${1:-}" != "--build" ]]; then
    echo "llama-wheel: a cross-built $CROSS wheel cannot be installed into this $(uname -m) env; add --build" >&2
    exit 2
fi
CMAKE_FLAGS="-DLLAVA_BUILD=OFF"
if [[ "${PREFIX_EDGE_LLAMA_NATIVE:-0}" == "1" ]]; then
    if [[ -n "$CROSS" ]]; then
        echo "llama-wheel: PREFIX_EDGE_LLAMA_NATIVE=1 cannot be cross-built; build natively on the target" >&2
        exit 2
    fi
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
        aarch64)  # Linux arm64 (macOS says arm64 and keeps its defaults): plain ARMv8-A, NEON, no dotprod/SVE
            CMAKE_FLAGS="$CMAKE_FLAGS -DGGML_CPU_ARM_ARCH=armv8-a"
            ;;
    esac
fi
CMAKE_FLAGS="$CMAKE_FLAGS ${PREFIX_EDGE_LLAMA_CMAKE_ARGS:-}"
KEY="$(printf '%s' "$VERSION $ARCH $CMAKE_FLAGS" | sha256sum | cut -c1-12)"
ROOT="${PREFIX_EDGE_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/prefix-edge/wheelhouse}"
HOUSE="$ROOT/llama-cpp-python-$VERSION-$ARCH-$FLAVOUR-$KEY"

wheel_path() { ls "$HOUSE"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -n1; }

cross_setup() {  # $1: a directory; the aarch64 compilers (apt when root) and a toolchain file in $1
    if ! command -v aarch64-linux-gnu-g++ >/dev/null 2>&1; then
        if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
            echo "llama-wheel: installing gcc-aarch64-linux-gnu g++-aarch64-linux-gnu with apt-get" >&2
            { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
                  gcc-aarch64-linux-gnu g++-aarch64-linux-gnu >/dev/null 2>&1 \
              || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
                  --no-install-recommends gcc-aarch64-linux-gnu g++-aarch64-linux-gnu >/dev/null 2>&1; }; } \
            || { echo "llama-wheel: apt-get could not install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu" >&2; exit 1; }
        else
            echo "llama-wheel: the cross build needs aarch64-linux-gnu-gcc/g++ (Debian: apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu)" >&2
            exit 1
        fi
    fi
    cat > "$1/aarch64-linux-gnu.cmake" <<'CMAKE'
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
CMAKE
}

check_cross_wheel() {  # $1: the wheel; every shared library in it must be an AArch64 ELF
    "$PY" - "$1" <<'PYCHECK'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    libs = [n for n in z.namelist() if ".so" in n.rsplit("/", 1)[-1]]
    bad = [n for n in libs if int.from_bytes(z.read(n)[18:20], "little") != 183]  # e_machine, EM_AARCH64
if not libs or bad:
    sys.exit(f"llama-wheel: not an aarch64 build: {bad or 'no libraries in the wheel'}")
if not sys.argv[1].endswith("-linux_aarch64.whl"):  # scikit-build-core tags from _PYTHON_HOST_PLATFORM
    sys.exit(f"llama-wheel: the cross-built wheel is not tagged linux_aarch64: {sys.argv[1]}")
PYCHECK
}

carry_libgomp() {  # $1: the wheel, $2: the compiler that built it; libgomp.so.1 into llama_cpp/lib/
    # ggml's CPU backend links GNU OpenMP; a minimal OS image (a device's, a container's) has no
    # libgomp1, and the import then fails. The wheel carries the compiler's own copy next to the
    # libraries (their RUNPATH is $ORIGIN), with its licence (GPL-3 with the GCC Runtime Library
    # Exception, which allows this). Measured: this build decodes faster than one without OpenMP
    # on ggml's own thread pool (docs/contention.md). Idempotent; nothing to do for a build
    # without OpenMP (macOS).
    local lib
    lib="$("$2" -print-file-name=libgomp.so.1 2>/dev/null || true)"
    "$PY" - "$1" "$lib" <<'PYCARRY'
import base64, hashlib, os, sys, zipfile
wheel, lib = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()  # scikit-build-core puts the libraries in llama_cpp/lib/ and lib/
    libdirs = [n.rsplit("/", 1)[0] for n in names if n.endswith("/libggml-cpu.so")
               and f"{n.rsplit('/', 1)[0]}/libgomp.so.1" not in names and b"libgomp.so.1" in z.read(n)]
    if not libdirs:
        sys.exit(0)
    items = [(i, z.read(i)) for i in z.infolist()]
if not os.path.isabs(lib) or not os.path.isfile(lib):
    sys.exit(f"llama-wheel: the build links libgomp.so.1 but the compiler does not say where it is ({lib!r})")
with open(lib, "rb") as f:
    gomp = f.read()
notice = b"libgomp.so.1, copied from the compiler that built this wheel (GCC).\n"
for doc in ("/usr/share/doc/libgomp1/copyright", "/usr/share/doc/libgomp1-arm64-cross/copyright"):
    if os.path.isfile(doc):
        with open(doc, "rb") as f:
            notice += b"\n" + f.read()
        break
else:
    notice += b"GPL-3.0-or-later WITH GCC-exception-3.1 (the GCC Runtime Library Exception)\n"
added = {f"{d}/{n}": data for d in libdirs for n, data in (("libgomp.so.1", gomp), ("libgomp.so.1.LICENSE", notice))}
def line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"
tmp = wheel + ".tmp"
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
    for info, data in items:
        if info.filename.endswith(".dist-info/RECORD"):
            record = info.filename
            rows = data.decode().splitlines()
            rows = [r for r in rows if not r.startswith(record + ",")]
            rows += [line(n, d) for n, d in added.items()] + [f"{record},,"]
            continue
        out.writestr(info, data)
    for n, d in added.items():
        zi = zipfile.ZipInfo(n, date_time=(2026, 1, 1, 0, 0, 0))
        zi.external_attr = 0o100755 << 16
        out.writestr(zi, d, zipfile.ZIP_DEFLATED)
    out.writestr(record, "\n".join(rows) + "\n")
os.replace(tmp, wheel)
print(f"llama-wheel: carried {lib} ({len(gomp)} bytes) into the wheel's {', '.join(libdirs)}", file=sys.stderr)
PYCARRY
}

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
    if [[ -n "$CROSS" ]]; then  # the toolchain file is not part of the key: same flags, same wheel as native
        cross_setup "$TMP"
        CMAKE_ARGS="$CMAKE_FLAGS -DCMAKE_TOOLCHAIN_FILE=$TMP/aarch64-linux-gnu.cmake" _PYTHON_HOST_PLATFORM="linux-aarch64" \
            CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || echo 2)" \
            "$PY" -m pip wheel --quiet --no-cache-dir --no-deps "$SDIST" -w "$TMP"
        check_cross_wheel "$TMP"/llama_cpp_python-"$VERSION"-*.whl
        rm -f "$TMP/aarch64-linux-gnu.cmake"
    else
        CMAKE_ARGS="$CMAKE_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || echo 2)" \
            "$PY" -m pip wheel --quiet --no-cache-dir --no-deps "$SDIST" -w "$TMP"
    fi
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
if [[ "$ARCH" == "aarch64" && "$(uname -m)" != "aarch64" ]]; then carry_libgomp "$WHEEL" aarch64-linux-gnu-gcc
elif [[ "$(uname -s)" == "Linux" ]]; then carry_libgomp "$WHEEL" "${CC:-gcc}"
fi
if [[ "${1:-}" == "--build" ]]; then
    echo "$WHEEL"
    exit 0
fi
# --force-reinstall --no-deps replaces a native build an older install may have left in this env;
# the second call installs the wheel's own dependencies.
"$PY" -m pip install --quiet --force-reinstall --no-deps "$WHEEL"
"$PY" -m pip install --quiet "$WHEEL"
echo "llama-wheel: installed $WHEEL" >&2
