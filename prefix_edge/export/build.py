"""`prefix-edge export`: model + task file → bundle, built in a temp dir and renamed into place.

Stages: source model → ONNX graph → quantize → tokenizer → bake each task's prefix through the
*deployed* (quantized) graph → manifest (written last) → atomic rename.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from .. import __version__
from ..bundle import BackendInfo, Manifest, TaskInfo, TaskPrefixFile, TokenizerInfo, hash_files, sha256_file
from ..errors import PrefixEdgeError
from ..tasks import load_tasks, render_task, text_hash
from .progress import Stages

FORMATS = ("onnx",)


def export_bundle(model: Path | None, tasks_file: Path | None, out: Path, formats=("onnx",),
                  quantize: str = "int4", force: bool = False, progress: bool = True) -> Manifest:
    from ..paths import default_tasks_file
    from ..quantize.onnx import CHOICES
    from .source import default_model_path

    for f in formats:
        if f not in FORMATS:
            raise PrefixEdgeError(f"unknown format {f!r}; supported: {', '.join(FORMATS)}")
    if quantize not in CHOICES:
        raise PrefixEdgeError(f"unknown quantization {quantize!r}; choose one of {', '.join(CHOICES)}")
    if model is None:
        model = default_model_path()
        tasks_file = tasks_file or default_tasks_file()
    if tasks_file is None:
        raise PrefixEdgeError("no task file: pass --tasks FILE")
    specs = load_tasks(tasks_file)  # validate before any slow work
    out = Path(out)
    if out.exists() and not force:
        raise PrefixEdgeError(f"{out} already exists; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with Stages(progress) as st:
            manifest = _build(Path(model), specs, tmp, quantize, st)
            manifest.extra["export_seconds"] = st.timings
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _replace(tmp: Path, out: Path) -> None:
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _build(model: Path, specs, root: Path, quantize: str, st: Stages) -> Manifest:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from ..quantize.onnx import quantize_onnx
    from .bake import bake_onnx, prefix_ids
    from .onnx import export_onnx
    from .source import eos_ids, model_info, prepare_hf_dir

    work = root / "_work"
    work.mkdir()
    with st.stage(f"load {model.name}"):
        hf_dir = prepare_hf_dir(model, work)
        tok = AutoTokenizer.from_pretrained(str(hf_dir))
        if not tok.is_fast:
            raise PrefixEdgeError(f"{model}: needs a fast tokenizer (tokenizer.json)")
        tok.save_pretrained(str(root / "tokenizer"))
    info = model_info(hf_dir, source=model.name, eos_token_ids=eos_ids(hf_dir, tok))
    chat_template = tok.chat_template if isinstance(tok.chat_template, str) else \
        (tok.chat_template or {}).get("default")
    special = {k: getattr(tok, k) or "" for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    rendered = {s.name: render_task(s, chat_template, special) for s in specs}
    rt_tok = Tokenizer.from_file(str(root / "tokenizer" / "tokenizer.json"))
    ids = {name: prefix_ids(rt_tok, r, name, info.n_ctx) for name, r in rendered.items()}  # fail fast

    with st.stage("export ONNX (fp32)"):
        fp32 = export_onnx(hf_dir, work / "onnx-fp32")
    with st.stage(f"quantize ONNX ({quantize})"):
        onnx_dir = root / "onnx"
        quantize_onnx(fp32, onnx_dir / "model.onnx", quantize)
    shutil.rmtree(work)

    model_files = sorted(str(p.relative_to(root)) for p in onnx_dir.iterdir())
    onnx_info = BackendInfo(files=hash_files(root, model_files), kv_dtype="", quantization=quantize)
    tokenizer = TokenizerInfo(file="tokenizer/tokenizer.json",
                              sha256=sha256_file(root / "tokenizer/tokenizer.json"),
                              chat_template_sha256=text_hash(chat_template))
    manifest = Manifest(model=info, tokenizer=tokenizer, backends={"onnx": onnx_info}, tasks={},
                        created_by=f"prefix-edge {__version__}")
    manifest.extra["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    (root / "tasks").mkdir()
    with st.stage("bake task prefixes (onnx)", total=len(specs)) as advance:
        baked = bake_onnx(root / "onnx" / "model.onnx", manifest, ids, root, advance)
    for s in specs:
        r = rendered[s.name]
        n_tokens, prefix_file = baked[s.name]
        manifest.tasks[s.name] = TaskInfo(
            kind=s.kind, chat=r.chat, prefix_tokens=n_tokens, input_before=r.input_before,
            input_after=r.input_after, template=r.template, defaults=dict(s.defaults),
            prefixes={"onnx": prefix_file})
    manifest.write(root)
    return manifest

