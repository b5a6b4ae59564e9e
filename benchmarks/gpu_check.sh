#!/usr/bin/env bash
# The GPU check, for the day a CUDA device is lent: install the GPU builds (onnxruntime-gpu with
# its CUDA/cuDNN wheels, llama.cpp built with -DGGML_CUDA=on for this GPU only) into their own
# venv, open the default bundle (exported with the CPU venv when missing), and on both engines
# check baked == prefilled on CUDA and measure restore time and TTFT against CPU
# (benchmarks/gpu_check.py). Writes gpu-check-YYYY-MM-DD.json into $OUT (the device tool's
# folder) or docs/, its log into $OUT or /tmp. Aims at under 10 minutes (the llama.cpp CUDA build is most
# of it; each phase has its own time limit).
#
#   bash benchmarks/gpu_check.sh                    # from the repo root, network or wheelhouse
#   PREFIX_EDGE_GPU_WHEELS=DIR bash benchmarks/gpu_check.sh   # offline: wheels + the sdist in DIR
#   PREFIX_EDGE_GPU_DRY=1 bash benchmarks/gpu_check.sh        # no GPU: the CPU rows only (a check of the script)
#
# Offline devices: on a host with network, fill DIR once with
#   pip download -d DIR 'onnxruntime-gpu[cuda,cudnn]' numpy tokenizers safetensors jinja2 llguidance \
#       typer rich platformdirs diskcache typing-extensions scikit-build-core cmake ninja setuptools wheel
#   pip download -d DIR --no-deps --no-binary :all: llama-cpp-python==0.3.36
# (manylinux wheels for the device's Python), then copy DIR there.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
DATE="$(date -u +%Y-%m-%d)"
RESULT="${OUT:-$REPO/docs}/gpu-check-$DATE.json"   # docs/ beside the other measured reports
LOG="${OUT:-${TMPDIR:-/tmp}}/gpu-check-$DATE.log"
VENV="${PREFIX_EDGE_GPU_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/prefix-edge/venv-gpu}"
PY_BASE="${PYTHON:-python3}"
DRY="${PREFIX_EDGE_GPU_DRY:-0}"
mkdir -p "$(dirname "$RESULT")" "$(dirname "$LOG")"
: > "$LOG"
declare -A SECONDS_OF=()
NOTES=()

say() { echo "gpu-check: $*" | tee -a "$LOG" >&2; }
phase() {  # $1: name, $2: time limit (s), the rest: the command; records its seconds
    local name="$1" limit="$2" t0 rc=0
    shift 2
    t0=$(date +%s)
    say "$name (limit ${limit}s)"
    timeout "$limit" "$@" >>"$LOG" 2>&1 || rc=$?
    SECONDS_OF[$name]=$(( $(date +%s) - t0 ))
    if [[ $rc -ne 0 ]]; then
        say "$name: exit $rc (see $LOG)"
    fi
    return $rc
}

# -- the device ---------------------------------------------------------------------------------
GPU="none"
DEVICES="cpu,cuda"
if [[ "$DRY" == "1" ]]; then
    DEVICES="cpu"
    NOTES+=("PREFIX_EDGE_GPU_DRY=1: CPU rows only")
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    GPU="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n1)"
else
    say "no NVIDIA GPU here (nvidia-smi missing or failing); set PREFIX_EDGE_GPU_DRY=1 for the CPU rows"
    exit 2
fi
say "gpu: $GPU"

PIP_SRC=()
if [[ -n "${PREFIX_EDGE_GPU_WHEELS:-}" ]]; then
    PIP_SRC=(--no-index --find-links "$PREFIX_EDGE_GPU_WHEELS")
    export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PREFIX_EDGE_GPU_WHEELS"   # llama-wheel.sh's sdist download too
fi

# -- the GPU venv (~/.cache/prefix-edge/venv-gpu): prefix-edge (runtime only) + onnxruntime-gpu --
if [[ ! -x "$VENV/bin/python" ]]; then
    phase "venv" 120 "$PY_BASE" -m venv "$VENV"
fi
PY="$VENV/bin/python"
ORT_SPEC="onnxruntime-gpu[cuda,cudnn]"
[[ "$DRY" == "1" ]] && ORT_SPEC="onnxruntime"
phase "pip install prefix-edge + $ORT_SPEC" 300 "$PY" -m pip install --quiet "${PIP_SRC[@]}" \
    "$ORT_SPEC" -e "$REPO" diskcache typing-extensions
if [[ "$DRY" != "1" ]]; then
    # onnxruntime (CPU) and onnxruntime-gpu share the module name: keep the GPU one only
    "$PY" -m pip uninstall --quiet -y onnxruntime >>"$LOG" 2>&1 || true
    phase "reinstall onnxruntime-gpu" 300 "$PY" -m pip install --quiet --force-reinstall --no-deps \
        "${PIP_SRC[@]}" onnxruntime-gpu
    # the CUDA/cuDNN libraries pip put in site-packages/nvidia/*/lib, for ORT's CUDA provider
    NV_LIBS="$("$PY" -c 'import glob,site,os; print(os.pathsep.join(sorted(glob.glob(os.path.join(site.getsitepackages()[0],"nvidia","*","lib")))))')"
    export LD_LIBRARY_PATH="${NV_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# -- llama.cpp built for CUDA (this GPU's architecture only: a few minutes on 16 cores) ----------
if [[ "$DRY" == "1" ]]; then
    phase "llama-cpp-python (portable CPU build)" 900 env PYTHON="$PY" bash scripts/llama-wheel.sh
elif command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH="$PATH:/usr/local/cuda/bin"
    phase "llama-cpp-python CUDA build" 480 env PYTHON="$PY" \
        PREFIX_EDGE_LLAMA_CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=native" \
        bash scripts/llama-wheel.sh || NOTES+=("llama.cpp CUDA build failed: see the log")
else
    NOTES+=("no nvcc (CUDA toolkit): llama.cpp's CUDA build skipped, the gguf cuda row will say so")
    phase "llama-cpp-python (portable CPU build)" 900 env PYTHON="$PY" bash scripts/llama-wheel.sh \
        || NOTES+=("llama.cpp CPU build failed: see the log")
fi

# -- the bundle: the default one, exported by the CPU venv when it is missing ------------------
if ! "$PY" -c 'from prefix_edge.bundle import Bundle; Bundle.open(None)' >>"$LOG" 2>&1; then
    if [[ -x "$REPO/.venv/bin/prefix-edge" ]]; then
        phase "prefix-edge export (CPU venv)" 600 "$REPO/.venv/bin/prefix-edge" export
    else
        say "no default bundle and no $REPO/.venv to export one with (bash .ci/run makes it)"
        exit 2
    fi
fi
phase "doctor" 120 "$VENV/bin/prefix-edge" doctor --refresh || true

# -- the measurements ---------------------------------------------------------------------------
CONTEXT="$("$PY" - "$GPU" "$DATE" <<'PYCTX'
import json, sys
print(json.dumps({"gpu": sys.argv[1], "day": sys.argv[2]}))
PYCTX
)"
RC=0
t0=$(date +%s)
timeout 300 "$PY" benchmarks/gpu_check.py --devices "$DEVICES" --runs 5 --out "$RESULT" \
    --context "$CONTEXT" 2>>"$LOG" || RC=$?
SECONDS_OF[measure]=$(( $(date +%s) - t0 ))
[[ -f "$RESULT" ]] || { say "no result written (exit $RC; see $LOG)"; exit 1; }
# the phases' seconds and the notes into the result
PHASES=""
for k in "${!SECONDS_OF[@]}"; do PHASES+="$k"$'\t'"${SECONDS_OF[$k]}"$'\n'; done
"$PY" - "$RESULT" "$PHASES" "${NOTES[@]+"${NOTES[@]}"}" <<'PYMERGE'
import json, sys
path, phases, notes = sys.argv[1], sys.argv[2], sys.argv[3:]
d = json.load(open(path))
d["phase_seconds"] = {k: int(v) for k, v in (ln.split("\t") for ln in phases.splitlines() if ln)}
d["notes"] = notes
open(path, "w").write(json.dumps(d, indent=1) + "\n")
PYMERGE
say "wrote $RESULT (exit $RC: 0 when every row opened and baked == prefilled)"
exit $RC
