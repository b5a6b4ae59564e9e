"""HF checkpoint -> GGUF with llama.cpp's own converter, of the llama.cpp version inside the
installed llama-cpp-python.

llama.cpp's `convert_hf_to_gguf.py` (with its `conversion/` package, one module per model
family, and its `gguf-py`) ships in llama-cpp-python's source distribution under
`vendor/llama.cpp/`. `scripts/llama-wheel.sh` builds the wheel from that sdist and keeps those
files next to the wheel (`<wheelhouse>/llama-cpp-python-<version>-.../llama.cpp/`); where they
are missing they are fetched once from the package index (the sdist of the installed version)
into `$PREFIX_EDGE_HOME/llama.cpp-<version>/`. `$PREFIX_EDGE_LLAMA_CONVERTER` names another
directory holding `convert_hf_to_gguf.py`.

The converter runs in a child process (it imports torch and its own `gguf`), the output written
to `<out>.part` and renamed when whole. One thing it cannot do is kept from prefix-edge's own
converter: llama.cpp names a BPE pre-tokenizer by hashing the tokens of a test string against the
models it knows, so a tokenizer trained for a new model (or a test) is refused; there the
pre-tokenizer of tokenizer.json is read and mapped onto the llama.cpp name that splits the same
way (`gguf.pre_tokenizer_name`), or refused if none does.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ..errors import PrefixEdgeError

ENV = "PREFIX_EDGE_LLAMA_CONVERTER"
PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE")


def llama_cpp_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        raise PrefixEdgeError("GGUF export needs llama-cpp-python: bash scripts/llama-wheel.sh") from None


def _wheelhouse() -> Path:
    root = os.environ.get("PREFIX_EDGE_WHEELHOUSE")
    if root:
        return Path(root)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "prefix-edge" / "wheelhouse"


def converter_dir(fetch: bool = True) -> Path:
    """The directory holding llama.cpp's converter for the installed llama-cpp-python."""
    named = os.environ.get(ENV)
    if named:
        d = Path(named)
        if not (d / "convert_hf_to_gguf.py").is_file():
            raise PrefixEdgeError(f"${ENV}={named} holds no convert_hf_to_gguf.py")
        return d
    ver = llama_cpp_version()
    for hit in sorted(glob.glob(str(_wheelhouse() / f"llama-cpp-python-{ver}-*" / "llama.cpp"))):
        if (Path(hit) / "convert_hf_to_gguf.py").is_file():
            return Path(hit)
    from ..paths import home

    mine = home() / f"llama.cpp-{ver}"
    if (mine / "convert_hf_to_gguf.py").is_file():
        return mine
    if not fetch:
        raise PrefixEdgeError(f"llama.cpp's converter for llama-cpp-python {ver} is not here")
    return fetch_converter(ver, mine)


def fetch_converter(ver: str, dest: Path) -> Path:
    """Download llama-cpp-python's sdist of version `ver` and keep its converter files in `dest`."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={ver}", "-d", tmp]
        got = subprocess.run(cmd, capture_output=True, text=True)
        sdists = glob.glob(os.path.join(tmp, "llama_cpp_python-*.tar.gz"))
        if not sdists:
            last = (got.stderr.strip().splitlines() or ["no output"])[-1]
            raise PrefixEdgeError(f"could not fetch llama-cpp-python {ver}'s source (for llama.cpp's "
                                  f"converter): {last}")
        extract_converter(Path(sdists[0]), dest)
    return dest


def extract_converter(sdist: Path, dest: Path) -> None:
    """The converter's files of an sdist into `dest` (atomically: a half copy is never used)."""
    part = dest.with_name(dest.name + f".part-{os.getpid()}")
    shutil.rmtree(part, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        for m in tar.getmembers():
            rel = m.name.split("/vendor/llama.cpp/", 1)
            if len(rel) != 2 or not rel[1].startswith(PARTS) or not (m.isfile() or m.isdir()):
                continue
            target = part / rel[1]
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(m) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
    if not (part / "convert_hf_to_gguf.py").is_file():
        shutil.rmtree(part, ignore_errors=True)
        raise PrefixEdgeError(f"{sdist.name} has no vendor/llama.cpp/convert_hf_to_gguf.py")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(part, dest)


def converter_knows(architecture: str) -> bool | None:
    """Whether llama.cpp's converter (of the installed llama-cpp-python) registers this HF
    architecture (its conversion/__init__.py map); None when the converter is not here."""
    import re

    try:
        conv = converter_dir(fetch=False)
    except PrefixEdgeError:
        return None
    table = conv / "conversion" / "__init__.py"
    text = table.read_text(encoding="utf-8") if table.is_file() else \
        (conv / "convert_hf_to_gguf.py").read_text(encoding="utf-8")
    return re.search(r"""["']""" + re.escape(architecture) + r"""["']""", text) is not None


def convert(hf_dir: Path, out: Path, outtype: str) -> None:
    """Run llama.cpp's converter on `hf_dir`, writing `out` (outtype: f32, f16, bf16, q8_0)."""
    conv = converter_dir()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    cmd = [sys.executable, "-m", "prefix_edge.export._run_llama_converter", str(conv),
           str(hf_dir), "--outfile", str(tmp), "--outtype", outtype, *_without_missing_mtp(Path(hf_dir))]
    got = subprocess.run(cmd, capture_output=True, text=True)
    if got.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise PrefixEdgeError(_reason(got.stdout + got.stderr, Path(hf_dir)))
    os.replace(tmp, out)


# architectures whose converter adds the checkpoint's multi-token-prediction head to the GGUF (as
# extra "nextn" blocks, llama.cpp's MTP drafter) and asserts a checkpoint has one
MTP_ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3NextForCausalLM")


def mtp_layers(hf_dir: Path) -> int:
    """How many MTP layers the checkpoint's weights hold (0: none; tensors `mtp.*`)."""
    import json

    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        names = list(json.loads(index.read_text()).get("weight_map", {}))
    else:
        from safetensors import safe_open

        names = []
        for f in sorted(hf_dir.glob("*.safetensors")):
            with safe_open(str(f), "np") as h:
                names += list(h.keys())
    layers = {n.split(".")[2] for n in names if n.startswith(("mtp.layers.", "model.mtp.layers."))
              for n in [n.removeprefix("model.")]}
    return len(layers) or int(any(n.removeprefix("model.").startswith("mtp.") for n in names))


def _without_missing_mtp(hf_dir: Path) -> list[str]:
    """`--no-mtp` for a checkpoint of an MTP architecture that ships no MTP head (llama.cpp's
    converter would assert on it); a head it has is kept in the GGUF."""
    import json

    cfg = json.loads((hf_dir / "config.json").read_text())
    if (cfg.get("architectures") or ["?"])[0] not in MTP_ARCHITECTURES:
        return []
    return [] if mtp_layers(hf_dir) else ["--no-mtp"]


def _reason(log: str, hf_dir: Path) -> str:
    """The one line of the converter's output that says why it failed."""
    lines = [l.strip() for l in log.splitlines() if l.strip()]
    for l in reversed(lines):
        if l.startswith("prefix-edge: "):
            return l[len("prefix-edge: "):]
    for l in reversed(lines):
        if "not supported" in l or "Error" in l or "error" in l:
            text = l.split(": ", 1)[-1] if l.startswith(("ERROR:", "NotImplementedError", "ValueError")) else l
            return f"llama.cpp's converter ({llama_cpp_version()}) cannot convert {hf_dir.name}: {text}"
    return f"llama.cpp's converter failed on {hf_dir.name}: {lines[-1] if lines else 'no output'}"
