"""llama.cpp calls that can abort the process on a model's content, run in a child process.

llama.cpp checks much of a model's metadata with GGML_ASSERT, which aborts (SIGABRT) instead
of returning an error: a Granite 4.0-H config that leaves `num_experts_per_tok` at its default
beside `num_local_experts = 0` aborted `llama_model_quantize` (GGML_ASSERT(n_expert_used_max
<= n_expert) in load_hparams), and with it the whole export. So export quantizes, and loads a
GGUF it has just written for the first time, in a child: an abort there is one error line
naming the model and what llama.cpp said. Where the engine cannot load a model, a child loads
it again with llama.cpp's log on to say why (the engine keeps the log off).

    python -m prefix_edge.llamacpp.child quantize SRC DST FTYPE ALLOW_REQUANTIZE
    python -m prefix_edge.llamacpp.child load MODEL
    python -m prefix_edge.llamacpp.child tokenize MODEL TEXTS.json IDS.json
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from ..errors import PrefixEdgeError


def quantize(src: Path, dst: Path, ftype: int, allow_requantize: bool, name: str) -> None:
    """llama_model_quantize(src -> dst) in a child, then dst loaded and decoded there too."""
    _run(["quantize", str(src), str(dst), str(int(ftype)), str(int(allow_requantize))],
         f"quantizing {name}")


def check_loads(path: Path, name: str) -> None:
    """Load the GGUF model at `path` in a child, make a small context and decode a token:
    whatever llama.cpp cannot do with this model is a PrefixEdgeError, never an abort here."""
    _run(["load", str(path)], f"loading {name}")


def check_mtp_loads(path: Path, name: str) -> None:
    """Load the MTP head GGUF at `path` in a child (its MTP layers asked for) and make its MTP
    context: whatever llama.cpp cannot do with it is a PrefixEdgeError, never an abort here."""
    _run(["load-mtp", str(path)], f"loading {name}")


def tokenize(path: Path, cases: list[tuple[str, bool, bool]], name: str) -> tuple[list[list[int]], list[int], list[int]]:
    """llama.cpp's own tokenizer of the GGUF at `path` (its vocabulary alone) over `cases`, each
    (text, add_special, parse_special), and every token's attributes as llama.cpp reads them
    (LLAMA_TOKEN_ATTR_* bits: control, user-defined, ..., after its own corrections) and its
    end-of-generation tokens, in a child: a vocabulary llama.cpp aborts on is an error line."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="prefix-edge-tok-") as d:
        src, dst = Path(d) / "texts.json", Path(d) / "ids.json"
        src.write_text(json.dumps([list(c) for c in cases]), encoding="utf-8")
        _run(["tokenize", str(path), str(src), str(dst)], f"tokenizing with {name}'s vocabulary")
        out = json.loads(dst.read_text(encoding="utf-8"))
        return out["ids"], out["attrs"], out["eog"]


def load_failure(path: Path) -> str:
    """Why llama.cpp cannot load the GGUF model at `path` (what its log says), one line."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                return "not a GGUF file (no GGUF magic at its start)"
    except OSError as e:
        return f"cannot read it: {e.strerror or e}"
    failed = _attempt(["load", str(path)])
    if failed is None:
        return "llama.cpp cannot load it in this process, though a child process can (out of memory?)"
    sig, why = failed
    return f"llama.cpp aborted ({sig}): {why}" if sig else f"llama.cpp says: {why}"


def _run(args: list[str], doing: str) -> None:
    failed = _attempt(args)
    if failed is not None:
        sig, why = failed
        raise PrefixEdgeError(f"llama.cpp aborted ({sig}) {doing}: {why}" if sig else
                              f"llama.cpp failed {doing}: {why}")


def _attempt(args: list[str]) -> tuple[str, str] | None:
    """Run the child; None if it succeeded, else (the signal that killed it or "", the reason)."""
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # no debugger attached to print a backtrace
    p = subprocess.run([sys.executable, "-m", __name__, *args], capture_output=True, text=True,
                       errors="replace", env=env)
    if p.returncode == 0:
        return None
    sig = ""
    if p.returncode < 0:
        try:
            sig = signal.Signals(-p.returncode).name
        except ValueError:
            sig = f"signal {-p.returncode}"
    return sig, reason(p.stdout + "\n" + p.stderr)


_ASSERT = re.compile(r"(\S+:\d+): (GGML_ASSERT\(.*\) failed|.*)$")


def reason(log: str) -> str:
    """The line of a llama.cpp log that says what went wrong."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in lines:
        if "GGML_ASSERT" in ln or "GGML_ABORT" in ln:
            m = _ASSERT.search(ln)
            return f"{m.group(2)} ({m.group(1).rsplit('/', 1)[-1]})" if m else ln
    for ln in lines:
        if "error loading model:" in ln:
            return ln.split("error loading model:", 1)[1].strip()
    for ln in lines:
        if ln.startswith("ERROR "):
            return ln[6:]
    for ln in reversed(lines):
        if "error" in ln.lower() or "failed" in ln.lower():
            return re.sub(r"^\w+: ", "", ln)
    return lines[-1] if lines else "no output"


# -- the child ------------------------------------------------------------------------------

def _child(argv: list[str]) -> int:
    import ctypes

    from .lib import _bindings

    L, _ = _bindings()  # llama.cpp's own logging to stderr: the parent reads the reason there
    L.llama_backend_init()
    op = argv[0]
    if op == "tokenize":
        import json

        from .vocab import Vocab

        cases = json.loads(Path(argv[2]).read_text(encoding="utf-8"))
        with Vocab(Path(argv[1])) as v:
            out = {"ids": [v.tokenize(text, bool(add), bool(parse)) for text, add, parse in cases],
                   "attrs": v.attrs(), "eog": v.eog()}
        Path(argv[3]).write_text(json.dumps(out), encoding="utf-8")
        return 0
    if op == "quantize":
        src, dst, ftype, requant = argv[1], argv[2], int(argv[3]), bool(int(argv[4]))
        params = L.llama_model_quantize_default_params()
        params.ftype = ftype
        params.allow_requantize = requant
        rc = L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
        if rc != 0:
            print(f"ERROR llama_model_quantize returned {rc}", flush=True)
            return 2
        path = dst
    elif op == "load":
        path = argv[1]
    elif op == "load-mtp":  # an MTP head of its own: its layers loaded, an MTP context made
        mp = L.llama_model_default_params()
        mp.n_gpu_layers, mp.load_mtp = 0, True
        model = L.llama_model_load_from_file(argv[1].encode(), mp)
        if not model or L.llama_model_n_layer_nextn(model) < 1:
            print(f"ERROR llama.cpp cannot load {argv[1]} as an MTP head", flush=True)
            return 3
        cp = L.llama_context_default_params()
        cp.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
        cp.n_ctx = cp.n_batch = cp.n_ubatch = 64
        cp.n_threads = cp.n_threads_batch = 1
        if not L.llama_init_from_model(model, cp):
            print("ERROR llama.cpp cannot make an MTP context for this head", flush=True)
            return 3
        return 0
    else:
        print(f"ERROR unknown operation {op!r}", flush=True)
        return 2
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        print(f"ERROR llama.cpp cannot load {path}", flush=True)
        return 3
    cp = L.llama_context_default_params()
    cp.n_ctx = cp.n_batch = 64
    cp.n_threads = cp.n_threads_batch = 1
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        print("ERROR llama.cpp cannot make a context for this model", flush=True)
        return 3
    batch = L.llama_batch_init(1, 0, 1)
    batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = 0, 0, 1, 0, 1
    batch.n_tokens = 1
    rc = L.llama_decode(ctx, batch)
    if rc != 0:
        print(f"ERROR llama_decode of one token returned {rc}", flush=True)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
