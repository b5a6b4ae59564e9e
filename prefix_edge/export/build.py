"""`prefix-edge export`: model + task file → bundle, built in a temp dir and renamed into place.

Stages: source model (a .gguf for llama.cpp alone: its metadata and vocabulary, no transformers:
gguf_source.py) → tokenizer + task prefix ids, peft adapters read and checked (fail fast)
→ per format: the deployed model (ONNX: optimum export + quantization; GGUF: the source GGUF,
re-quantized on request, or an HF dir converted and quantized) → bake each task's prefix through
that deployed model → manifest (written last) → atomic rename.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from .. import __version__
from ..chat_template import check_template, template_specials
from ..bundle import BackendInfo, Manifest, TaskInfo, TokenizerInfo, hash_files, layout, sha256_file
from ..errors import PrefixEdgeError, disk_full
from ..tasks import load_tasks, render_task, text_hash
from ..progress import Stages

FORMATS = layout.BACKENDS  # a bundle's model formats: one per backend
DEFAULT_FORMATS = ("onnx", "gguf")
ONNX_BUILDERS = ("own", "optimum")  # export/onnx_graph.py (fused ops) | optimum + ORT fusions
DEFAULT_ONNX_QUANT = "int4"  # exact baked prefixes, smallest, fastest: see README
DEFAULT_GGUF_QUANT = "q8_0"  # for HF sources; a .gguf source is kept as it is: see README
KEEP = "keep"


def export_bundle(model: Path | None, tasks_file: Path | None, out: Path,
                  formats=None, quantize: str = DEFAULT_ONNX_QUANT,
                  gguf_quant: str | None = None, force: bool = False,
                  progress: bool = True, prefix_store: str = "f32",
                  onnx_builder: str = "own", gguf_kv: str = "f16",
                  compress_prefix: str | float | None = None, mtp_head: Path | None = None) -> Manifest:
    """Build a bundle at `out`. `gguf_quant` None: keep a .gguf source's type, or
    DEFAULT_GGUF_QUANT for an HF source. `gguf_kv`: llama.cpp's KV cache type the GGUF
    prefixes are baked in and the runtime then computes in (f16, or q8_0 with flash attention).
    `compress_prefix`: a ratio, "auto" or None: text tasks' prefixes compressed (export/compress.py).
    `mtp_head`: a .gguf model's MTP head GGUF, kept beside it (default: the one mtp-*.gguf beside
    the model that fits it; gguf_source.mtp_head_for)."""
    from ..paths import default_tasks_file
    from ..llamacpp.quantize import GGUF_QUANT_CHOICES
    from ..bundle.prefixfile import KV_STORES
    from ..llamacpp.lib import KV_TYPES  # a plain table: llama_cpp is not imported
    from ..quantize.onnx import CHOICES, Int4Recipe
    from .source import default_model_path

    optional_gguf = formats is None  # the default: skip gguf (warning) where llama.cpp can't run
    formats = tuple(dict.fromkeys(DEFAULT_FORMATS if formats is None else formats))
    for f in formats:
        if f not in FORMATS:
            raise PrefixEdgeError(f"unknown format {f!r}; supported: {', '.join(FORMATS)}")
    if not formats:
        raise PrefixEdgeError("no format given; use --format onnx,gguf")
    if quantize.startswith("int4"):
        Int4Recipe.parse(quantize)  # a bad recipe is refused before any work
    elif quantize not in CHOICES:
        raise PrefixEdgeError(f"unknown quantization {quantize!r}; choose one of {', '.join(CHOICES)}")
    if gguf_quant not in (None, KEEP, *GGUF_QUANT_CHOICES):
        raise PrefixEdgeError(f"unknown GGUF quantization {gguf_quant!r}; choose one of "
                              f"{', '.join((KEEP,) + GGUF_QUANT_CHOICES)}")
    if model is None:
        model = default_model_path()
        tasks_file = tasks_file or default_tasks_file()
    if tasks_file is None:
        raise PrefixEdgeError("no task file: pass --tasks FILE")
    if onnx_builder not in ONNX_BUILDERS:
        raise PrefixEdgeError(f"unknown ONNX builder {onnx_builder!r}; choose one of {', '.join(ONNX_BUILDERS)}")
    if prefix_store not in KV_STORES:
        raise PrefixEdgeError(f"unknown prefix store {prefix_store!r}; choose one of {', '.join(KV_STORES)}")
    if gguf_kv not in KV_TYPES:
        raise PrefixEdgeError(f"unknown GGUF KV cache type {gguf_kv!r}; choose one of {', '.join(KV_TYPES)}")
    from ..tasks.taskfile import compress_ratio

    compress = compress_ratio(compress_prefix)
    specs = load_tasks(tasks_file)  # validate before any slow work
    out = Path(out)
    if out.exists() and not force:
        raise PrefixEdgeError(f"{out} already exists; pass --force to replace it")
    if out.exists() and not _replaceable(out):
        raise PrefixEdgeError(f"{out} is not a prefix-edge bundle (no manifest.json) and not empty: "
                              "--force only replaces bundles")
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(out)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with Stages(progress) as st:
            manifest = _build(Path(model), specs, tmp, formats, quantize, gguf_quant, st,
                              optional_gguf, prefix_store, onnx_builder, gguf_kv, compress,
                              None if mtp_head is None else Path(mtp_head))
            manifest.extra["export_seconds"] = st.timings
            if st.warnings:
                manifest.extra["warnings"] = list(st.warnings)
            manifest.write(tmp)
        carry_created(out, tmp, manifest)
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _replaceable(out: Path) -> bool:
    """--force replaces a bundle (or an empty dir), never another directory or a file."""
    if out.is_symlink() or not out.is_dir():
        return False
    return (out / "manifest.json").is_file() or not any(out.iterdir())


def _remove_stale(out: Path) -> None:
    """Temp dirs of exports that died (kill -9, power loss) next to `out`: their PID is gone."""
    for p in out.parent.glob(f".{out.name}.*-*"):
        kind, _, pid = p.name[len(out.name) + 2:].rpartition("-")
        if kind not in ("partial", "old") or not pid.isdigit() or not p.is_dir():
            continue
        if int(pid) != os.getpid() and _pid_alive(int(pid)):
            continue
        shutil.rmtree(p, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two directories (Linux renameat2 RENAME_EXCHANGE); False where the OS or
    filesystem cannot."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    rc = fn(AT_FDCWD, os.fsencode(str(a)), AT_FDCWD, os.fsencode(str(b)), RENAME_EXCHANGE)
    return rc == 0


def _fsync_tree(root: Path) -> None:
    from ..paths import fsync_path

    for p in sorted(root.rglob("*"), reverse=True):
        fsync_path(p)


def carry_created(out: Path, tmp: Path, manifest) -> list[str]:
    """Tasks made at run time in the old bundle's store (bundle/created.py) that the new one can
    serve (the same model facts, tokenizer and chat template) are copied into the new bundle, so
    a re-export keeps them; the others stay behind with the old bundle. Their names."""
    from ..bundle.created import STORE_DIR, TaskStore

    src = out / STORE_DIR
    if not src.is_dir() or src.is_symlink():
        return []
    kept = sorted(TaskStore(src, manifest).read()[0])
    for name in kept:
        shutil.copytree(src / name, tmp / STORE_DIR / name, symlinks=True)
    return kept


def _replace(tmp: Path, out: Path) -> None:
    """Put the finished bundle at `out` so that at every instant `out` is the complete old
    bundle or the complete new one: one atomic exchange where the OS has it (then the old one
    is removed), else rename old away and new in (a kill between the two leaves the old one
    under .NAME.old-PID, which the next export removes)."""
    _fsync_tree(tmp)
    if not out.exists():
        os.rename(tmp, out)
        return
    if _exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old bundle
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def _build(model: Path, specs, root: Path, formats, quantize: str, gguf_quant: str | None,
           st: Stages, optional_gguf: bool = False, prefix_store: str = "f32",
           onnx_builder: str = "own", gguf_kv: str = "f16", compress=None, mtp_head: Path | None = None) -> Manifest:
    from tokenizers import Tokenizer

    from ..runtime.decode.constraint import check_task_defaults
    from ..runtime.engines import open_backend
    from ..runtime.engines.kv import hf_rope_layout
    from .bake import bake
    from ..tasks import ids_sha256, prefix_ids
    from .gguf_source import adopt_engine_shape, check_rope, read_gguf_source, takes_direct_path
    from .peft import check_adapter, read_adapter
    from .source import eos_ids, model_info, prepare_hf_dir
    from .tokenizer_check import check_bundle_tokenizer

    work = root / "_work"
    work.mkdir()
    # a .gguf source for llama.cpp alone: read and baked without transformers (gguf_source.py)
    direct = takes_direct_path(model, formats, specs, compress)
    hf_dir = tok = None
    if direct:
        with st.stage(f"read {model.name} (metadata, vocabulary)"), \
                _one_line(f"{model}: cannot read the GGUF's metadata or vocabulary"):
            src = read_gguf_source(model, root / layout.TOKENIZER_DIR)
        info, chat_template, special = src.info, src.chat_template, src.special
    else:
        from transformers import AutoTokenizer

        with st.stage(f"load {model.name}"), _one_line(f"{model}: cannot load the model or its tokenizer"):
            hf_dir = prepare_hf_dir(model, work, before_model=lambda t, n_ctx: _check_tasks(specs, t, n_ctx))
            tok = AutoTokenizer.from_pretrained(str(hf_dir))
            if not tok.is_fast:
                raise PrefixEdgeError(f"{model}: needs a fast tokenizer (tokenizer.json)")
            # tokenizer.json only: a slow tokenizer's vocab file of a GGUF source is the whole model
            tok.save_pretrained(str(root / layout.TOKENIZER_DIR), legacy_format=False)
            if model.suffix == ".gguf":  # the GGUF's split as llama.cpp's (source.py wrote it): transformers
                # 5's tokenizer class for the architecture puts its own pre-tokenizer back on load
                shutil.copyfile(hf_dir / "tokenizer.json", root / layout.TOKENIZER)
            info = model_info(hf_dir, source=model.name, eos_token_ids=eos_ids(hf_dir, tok))
        chat_template = tok.chat_template if isinstance(tok.chat_template, str) else \
            (tok.chat_template or {}).get("default")
        special = template_specials(tok)
    check_template(chat_template, special)  # written into the bundle: refused now if over budget
    rendered = {s.name: render_task(s, chat_template, special) for s in specs}
    rt_tok = Tokenizer.from_file(str(root / layout.TOKENIZER))
    # a task default that would fail every run (a constraint, a logit_bias id): refused now
    check_task_defaults(specs, rt_tok, info.vocab_size, info.eos_token_ids)
    adapters = {s.name: read_adapter(s) for s in specs if s.kind == "peft"}  # fail fast
    if adapters:  # (none on the direct path)
        base_names = [model.name, str(model), _config_name(hf_dir)]
        config = json.loads((hf_dir / "config.json").read_text())
        for a in adapters.values():
            check_adapter(a, info, base_names, st.warn, config)
    ids = {name: prefix_ids(rt_tok, r, name, info.n_ctx,
                            adapters[name].n_virtual if name in adapters else 0)
           for name, r in rendered.items()}

    compression = _plan_compression(hf_dir, info, tok, rt_tok, ids, adapters, compress, st,
                                    {s.name: s.compress_prefix for s in specs})

    backends = {}
    fusions: dict = {}
    if "onnx" in formats and "gguf" in formats and optional_gguf and onnx_builder == "own" and not direct:
        from .llama_convert import converter_knows
        from .onnx_graph import checked_config
        from .onnx_source import ARCHITECTURES

        arch = info.architecture
        if converter_knows(arch):  # the default formats: what the own graph cannot build is llama.cpp's alone
            why = None if arch in ARCHITECTURES else f"the own ONNX graph does not build {arch} yet"
            if why is None:
                try:
                    checked_config(hf_dir)
                except PrefixEdgeError as e:  # a setting it refuses (e.g. Gemma 4's experts)
                    why = str(e).split("; export with")[0]
            if why:
                st.warn(f"onnx backend skipped: {why}; the bundle is llama.cpp's (--format gguf)")
                formats = [f for f in formats if f != "onnx"]
    if "onnx" in formats:
        backends["onnx"] = _onnx_model(hf_dir, root / layout.MODEL_FILE["onnx"], quantize, work, st,
                                       fusions, onnx_builder)
    if "gguf" in formats and optional_gguf and "onnx" in backends and model.suffix != ".gguf":
        from .gguf import refuse_unsupported

        from .llama_convert import converter_knows, llama_cpp_version

        try:  # the default formats: a model llama.cpp cannot run as it is is the onnx bundle alone
            refuse_unsupported(json.loads((hf_dir / "config.json").read_text()))
            if not converter_knows(info.architecture):  # (LFM3, the OLMo hybrid)
                raise PrefixEdgeError(f"llama.cpp's converter ({llama_cpp_version()}) does not know "
                                      f"{info.architecture}; the bundle is ONNX's (--format onnx)")
        except PrefixEdgeError as e:
            st.warn(f"gguf backend skipped: {e}")
            formats = [f for f in formats if f != "gguf"]
    if "gguf" in formats:
        from .gguf_source import mtp_head_for

        head = mtp_head_for(model, mtp_head, st.warn)  # (a bad --mtp-head: refused before the copy)
        backends["gguf"] = _gguf_model(model, hf_dir, root / layout.MODEL_FILE["gguf"], gguf_quant, work, st)
        if head is not None:
            from ..llamacpp.child import check_mtp_loads

            with st.stage(f"copy MTP head ({head.name})"):
                shutil.copyfile(head, root / layout.MTP_HEAD)
                check_mtp_loads(root / layout.MTP_HEAD, head.name)  # in a child: an abort is an error line
        if not _llama_runs(root / layout.MODEL_FILE["gguf"], optional_gguf and "onnx" in backends, st):
            del backends["gguf"]
            shutil.rmtree(root / layout.model_dir("gguf"))
    tokenizer_check = check_bundle_tokenizer(model, root, backends, rt_tok, rendered, st)
    from .fidelity import probe_ids, reference, reference_dtype

    text_ids = [list(v)[-256:] for k, v in ids.items() if len(v) and k not in adapters][:1]
    probes, ref, ref_dtype = [], None, None  # direct: the deployed model is the source itself
    if not direct:
        probes = probe_ids(rt_tok, text_ids)
        ref_dtype = reference_dtype(hf_dir)
        if ref_dtype != "float32":
            st.warn(f"fidelity: the model's fp32 copy would not fit in memory: the reference runs in {ref_dtype}")
        with st.stage(f"fidelity reference (transformers {'fp32' if ref_dtype == 'float32' else ref_dtype})"):
            ref = reference(hf_dir, probes, ref_dtype)
    shutil.rmtree(work)
    for name, b in backends.items():
        b.files = hash_files(root, [str(p.relative_to(root)) for p in sorted((root / layout.model_dir(name)).iterdir())])

    tokenizer = TokenizerInfo(file=layout.TOKENIZER,
                              sha256=sha256_file(root / layout.TOKENIZER),
                              chat_template_sha256=text_hash(chat_template),
                              chat_template=chat_template, special_tokens=special)
    manifest = Manifest(model=info, tokenizer=tokenizer, backends=backends, tasks={},
                        created_by=f"prefix-edge {__version__}")
    manifest.extra["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if fusions:
        manifest.extra["onnx_fusions"] = fusions
    if tokenizer_check:
        manifest.extra["tokenizer_check"] = tokenizer_check
    if "onnx" in backends:
        manifest.extra["onnx_builder"] = onnx_builder
    for s in specs:
        r = rendered[s.name]
        a = adapters.get(s.name)
        n_virtual = a.n_virtual if a else 0
        plan = compression[0].get(s.name) if compression else None
        manifest.tasks[s.name] = TaskInfo(
            kind=s.kind, chat=r.chat,
            prefix_tokens=n_virtual + (len(plan.kept) if plan else len(ids[s.name])),
            input_before=r.input_before, input_after=r.input_after, template=r.template,
            defaults=dict(s.defaults), prefixes={}, n_virtual=n_virtual,
            adapter=a.manifest_entry() if a else None,
            chat_messages=[dict(m) for m in r.messages] if r.chat else None,
            compression=plan.record() if plan else None, prefix_sha256=ids_sha256(ids[s.name]))

    (root / layout.TASKS_DIR).mkdir()
    from .fidelity import GREEDY, measure, verdict

    n_ctx = max([t.n_virtual + len(ids[n]) for n, t in manifest.tasks.items()] +
                [len(p) + GREEDY for p in probes]) + 8
    for name in backends:
        with st.stage(f"bake task prefixes ({name})", total=len(specs)) as advance:
            model_file = layout.MODEL_FILE[name]
            options = {"gguf": {"kv_type": gguf_kv},  # the export's choices per engine (its flags)
                       "onnx": {"model_sha256": backends[name].files[model_file],  # keys ORT's session cache
                                "rope_layout": hf_rope_layout(manifest.model),  # the graph is the HF model's
                                **({"prefix_store": prefix_store} if prefix_store else {})}}[name]
            be = open_backend(name, root / model_file, n_ctx=n_ctx, **options)
            try:
                if direct:
                    adopt_engine_shape(manifest.model, be)
                    check_rope(manifest.model, be)
                baked = bake(be, manifest, ids, root, advance, adapters, root / model_file,
                             compression=compression)
                result = measure(be, probes, ref) if ref is not None else None
            finally:
                be.close()
        if result is not None:
            manifest.extra.setdefault("fidelity", {})[name] = {**result, "reference_dtype": ref_dtype}
            problem = verdict(name, result)
            if problem:
                st.warn(problem)
        for task, entry in baked.items():
            manifest.tasks[task].prefixes[name] = entry
    return manifest


def _plan_compression(hf_dir: Path, info, tok, rt_tok, ids: dict, adapters: dict, ratio, st,
                      per_task: dict):
    """(plans {task: Plan}, inv_freq, RoPE layers) for the text tasks, or None (no compression).
    `ratio`: export's flag; `per_task`: a task file's own `compress_prefix` (None: the flag's,
    "none": kept whole). Trained (peft) prefixes are kept whole: their virtual tokens are the
    adapter itself."""
    asked = {n: (per_task.get(n) if per_task.get(n) is not None else ratio)
             for n in ids if n not in adapters}
    asked = {n: r for n, r in asked.items() if r not in (None, "none")}
    if not asked:
        return None
    from .compress import Planner, check_model

    check_model(hf_dir, info)
    plans = {}
    with st.stage("compress task prefixes (transformers fp32)", total=len(asked)) as advance:
        planner = Planner(hf_dir, rt_tok, set(tok.all_special_ids))
        try:
            for name in asked:
                plan = planner.plan(name, list(ids[name]), asked[name])
                if plan is not None:
                    plans[name] = plan
                advance()
            inv_freq, rope_on = planner.inv_freq, planner.rope_layers
        finally:
            planner.close()
    return plans, inv_freq, rope_on


def _check_tasks(specs, tok, n_ctx: int) -> None:
    """Before a GGUF source's model is de-quantized (a minute on 2 cores), with its tokenizer
    alone: the chat template renders sample conversations within its budget and every task's
    prefix fits the model's context (at least its text: a peft task's virtual tokens come with
    its adapter, checked after)."""
    template = tok.chat_template if isinstance(tok.chat_template, str) else \
        (tok.chat_template or {}).get("default")
    special = template_specials(tok)
    check_template(template, special)
    for s in specs:
        text = render_task(s, template, special).prefix_text
        n = len(tok.backend_tokenizer.encode(text, add_special_tokens=False).ids) if text else 0
        if n + 1 >= n_ctx:
            raise PrefixEdgeError(f"task '{s.name}': prefix is {n} tokens, the model's context is {n_ctx}")


class _one_line:
    """Turn a library's exception (transformers, tokenizers, json ...) about bad input into one
    PrefixEdgeError line that says what was being read."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        if exc is None or isinstance(exc, (PrefixEdgeError, KeyboardInterrupt, SystemExit)):
            return False
        if not isinstance(exc, Exception):
            return False
        if disk_full(exc):
            raise PrefixEdgeError(f"No space left on device ({self.what.split(': ')[0]}): free "
                                  "some space or export to another disk") from None
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise PrefixEdgeError(f"{self.what}: {type(exc).__name__}{': ' + msg if msg else ''}") from None


def _llama_runs(model_file: Path, optional: bool, st: Stages) -> bool:
    """Probe llama.cpp (a child process, cached per build) before baking with it: a build that
    dies on this CPU is an error (or, for the default formats, a warning and no gguf model)."""
    from ..llamacpp.probe import llama_verdict

    v = llama_verdict(model_file)
    if v is None or v.ok:
        return True
    if not optional:
        raise PrefixEdgeError(f"cannot build the gguf backend on this machine: {v.detail}")
    st.warn(f"gguf backend skipped: {v.detail}")
    return False


def _config_name(hf_dir: Path) -> str:
    """The model's `_name_or_path` in its config.json (what transformers recorded), or ""."""
    import json

    try:
        return str(json.loads((hf_dir / "config.json").read_text()).get("_name_or_path") or "")
    except (OSError, ValueError):
        return ""


def _onnx_model(hf_dir: Path, dst: Path, quantize: str, work: Path, st: Stages,
                fusions: dict | None = None, builder: str = "own") -> BackendInfo:
    from ..quantize.onnx import quantize_onnx
    from .onnx import export_onnx

    if builder == "own":
        from .onnx_graph import build_onnx

        with st.stage("build ONNX graph (fp32, fused ops)"):
            fp32 = build_onnx(hf_dir, work / "onnx-fp32")
    else:
        with st.stage("export ONNX (fp32, optimum)"):
            fp32 = export_onnx(hf_dir, work / "onnx-fp32", warn=st.warn, report=fusions)
    with st.stage(f"quantize ONNX ({quantize})"):
        quantize_onnx(fp32, dst, quantize)
    return BackendInfo(files={}, kv_dtype="", quantization=quantize)


def _gguf_model(model: Path, hf_dir: Path, dst: Path, quant: str | None, work: Path,
                st: Stages) -> BackendInfo:
    from ..llamacpp.quantize import quantize_gguf
    from ..llamacpp.child import check_loads
    from .gguf import convert_hf_to_gguf, file_type_name

    dst.parent.mkdir(parents=True, exist_ok=True)
    if model.suffix == ".gguf":
        if quant in (None, KEEP):
            kept = file_type_name(model)
            with st.stage(f"copy GGUF ({kept})"):
                shutil.copyfile(model, dst)
                check_loads(dst, model.name)  # in a child: a model llama.cpp asserts on is an error
            return BackendInfo(files={}, kv_dtype="", quantization=kept)
        else:
            with st.stage(f"re-quantize GGUF ({quant})"):
                quantize_gguf(model, dst, quant, allow_requantize=True)
    else:
        quant = DEFAULT_GGUF_QUANT if quant in (None, KEEP) else quant
        with st.stage("convert to GGUF"):
            if quant in ("f32", "f16"):
                convert_hf_to_gguf(hf_dir, dst, quant)
            else:
                convert_hf_to_gguf(hf_dir, work / "model-f32.gguf", "f32")
        if quant not in ("f32", "f16"):
            with st.stage(f"quantize GGUF ({quant})"):
                quantize_gguf(work / "model-f32.gguf", dst, quant)
    return BackendInfo(files={}, kv_dtype="", quantization=file_type_name(dst))
