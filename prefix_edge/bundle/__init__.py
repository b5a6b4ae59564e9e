"""The bundle: the one contract between export and runtime, and the only code that knows its
format. This package: the typed manifest (here), its schema check (check.py), the layout and
path confinement (layout.py), the prefix-file codec (prefixfile.py) and file verification
(verify.py).

A bundle is a directory:

    manifest.json                   this file's schema (format_version 1)
    tokenizer/tokenizer.json        the tokenizer (HF tokenizers format)
    onnx/model.onnx[, .onnx_data]   the deployed (quantized) decoder graph
    gguf/model.gguf                 the deployed GGUF model for llama.cpp
    tasks/NAME.onnx.safetensors     per task: per-layer K/V of its prefix + the prefix ids
    tasks/NAME.gguf.safetensors     per task: llama.cpp's sequence-state blob + the prefix ids

A task's prefix occupies positions 0..P-1 (`TaskInfo.prefix_tokens` = P). For a trained (peft)
task the first `n_virtual` of them are virtual tokens, which have no token ids: a prefix file's
`prefix_ids` then hold only the P - n_virtual text ids after them, and its metadata carries
`n_virtual` too. Text tasks have n_virtual = 0.

Every backend has a *fingerprint*: the sha256 of everything a baked prefix depends on (model
file hashes, architecture, layers, KV heads, head dim, RoPE, vocab, tokenizer and chat-template
hashes, KV dtype, and for llama.cpp its state format and V layout). Each prefix file carries
the fingerprint it was baked against in its safetensors metadata; the runtime recomputes the
fingerprint from the files it is about to run and refuses a prefix whose fingerprint differs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PrefixEdgeError

from .layout import MANIFEST, confined  # noqa: E402,F401  (the layout's own module)

FORMAT = "prefix-edge-bundle"
FORMAT_VERSION = 2  # 2: task digests in prefix files, the whole model section in the fingerprint
MAX_MANIFEST_BYTES = 64 << 20


@dataclass
class ModelInfo:
    architecture: str
    model_type: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    n_ctx: int
    rope: dict[str, Any]
    eos_token_ids: list[int]
    source: str


@dataclass
class TokenizerInfo:
    file: str
    sha256: str
    chat_template_sha256: str | None
    chat_template: str | None = None  # the template text (its sha256 above is in the fingerprint)
    special_tokens: dict[str, Any] | None = None  # bos_token, eos_token ... as the template sees them


@dataclass
class BackendInfo:
    files: dict[str, str]  # relative path -> sha256
    kv_dtype: str
    quantization: str
    fingerprint: str = ""
    state: dict[str, Any] = field(default_factory=dict)  # what restoring a prefix depends on


@dataclass
class TaskPrefixFile:
    file: str
    sha256: str
    bytes: int
    fingerprint: str


@dataclass
class TaskInfo:
    kind: str
    chat: bool
    prefix_tokens: int  # KV positions of the prefix, virtual tokens included
    input_before: str
    input_after: str
    template: str
    defaults: dict[str, Any]
    prefixes: dict[str, TaskPrefixFile]  # backend -> file
    n_virtual: int = 0  # leading virtual (trained) positions of the prefix; they have no ids
    adapter: dict[str, Any] | None = None  # kind "peft": peft_type, num_virtual_tokens, name, sha256, base_model
    chat_messages: list[dict[str, str]] | None = None  # chat tasks: the messages the prefix renders


@dataclass
class Manifest:
    model: ModelInfo
    tokenizer: TokenizerInfo
    backends: dict[str, BackendInfo]
    tasks: dict[str, TaskInfo]
    created_by: str = ""
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    # -- fingerprint ----------------------------------------------------------------------
    def fingerprint(self, backend: str, file_hashes: dict[str, str] | None = None) -> str:
        """What a baked prefix for `backend` depends on. `file_hashes` overrides the recorded
        model file hashes (the runtime passes the hashes of the files actually on disk)."""
        b = self.backends[backend]
        m = self.model
        doc = {
            "format_version": self.format_version,
            "backend": backend,
            "model_files": dict(sorted((file_hashes or b.files).items())),
            "model": asdict(m),  # every model fact, n_ctx and eos ids included
            "tokenizer": self.tokenizer.sha256,
            "chat_template": self.tokenizer.chat_template_sha256,
            **({"special_tokens": self.tokenizer.special_tokens} if self.tokenizer.special_tokens else {}),
            "kv_dtype": b.kv_dtype,
            "state": b.state,
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    def task_digest(self, task: str) -> str:
        """What a task's answers depend on besides the model: everything in its manifest entry
        but the prefix files themselves. Baked into each of its prefix files' metadata."""
        d = asdict(self.tasks[task])
        d.pop("prefixes")
        if d.get("chat_messages") is None:  # a field newer than format 2: in the digest once set
            d.pop("chat_messages", None)
        d = json.loads(json.dumps({"task": task, **d}))  # as the manifest file spells it
        return hashlib.sha256(json.dumps(d, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def prefix_problem(self, task: str, meta: dict[str, str], fingerprint: str) -> str | None:
        """Why a prefix file with metadata `meta` is not `task`'s for a model of `fingerprint`
        ("baked for ..."), or None."""
        got = meta.get("fingerprint", "")
        if got != fingerprint:
            return (f"baked for a different model (fingerprint {got[:12] or 'none'} vs this "
                    f"bundle's {fingerprint[:12]})")
        if meta.get("task") != task or meta.get("task_digest") != self.task_digest(task):
            return (f"baked for task {meta.get('task')!r} with other settings than the manifest's "
                    "(edited manifest, or files swapped)")
        return None

    # -- (de)serialisation ----------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n"

    def write(self, bundle_dir: Path) -> None:
        (Path(bundle_dir) / MANIFEST).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def read(cls, bundle_dir: str | Path) -> "Manifest":
        """Read and validate a manifest: every field's type and range, every path confined to
        the bundle. Any problem is one PrefixEdgeError line."""
        bundle_dir = Path(bundle_dir)
        path = bundle_dir / MANIFEST
        if not bundle_dir.is_dir():
            raise PrefixEdgeError(f"no bundle at {bundle_dir}: directory not found")
        if not path.is_file():
            raise PrefixEdgeError(f"{bundle_dir} is not a prefix-edge bundle: {MANIFEST} not found")
        try:
            if path.stat().st_size > MAX_MANIFEST_BYTES:
                raise PrefixEdgeError(f"{path}: manifest is larger than {MAX_MANIFEST_BYTES >> 20} MB")
            d = json.loads(path.read_text(encoding="utf-8"))
        except PrefixEdgeError:
            raise
        except RecursionError:
            raise PrefixEdgeError(f"{path}: manifest is nested too deeply") from None
        except (ValueError, UnicodeDecodeError, OSError) as e:
            raise PrefixEdgeError(f"{path}: manifest is not valid JSON: {str(e).splitlines()[0]}") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise PrefixEdgeError(f"{path}: not a prefix-edge manifest")
        v = d.get("format_version")
        if isinstance(v, int) and not isinstance(v, bool) and v > FORMAT_VERSION:
            raise PrefixEdgeError(
                f"{path}: made by a newer prefix-edge ({d.get('created_by') or 'format ' + str(v)}, "
                f"bundle format {v}; this one reads {FORMAT_VERSION}): upgrade prefix-edge")
        if v != FORMAT_VERSION:
            raise PrefixEdgeError(
                f"{path}: bundle format version {v!r} is not supported by this prefix-edge "
                f"(reads version {FORMAT_VERSION}); re-export the bundle")
        from .check import check_manifest_dict

        check_manifest_dict(d, path)
        m = cls(
            model=ModelInfo(**d["model"]),
            tokenizer=TokenizerInfo(**d["tokenizer"]),
            backends={k: BackendInfo(**v) for k, v in d["backends"].items()},
            tasks={k: TaskInfo(**{**v, "prefixes": {b: TaskPrefixFile(**p) for b, p in v["prefixes"].items()}})
                   for k, v in d["tasks"].items()},
            created_by=d.get("created_by", ""),
            extra=d.get("extra", {}),
        )
        for rel in m.all_paths():
            confined(bundle_dir, rel, path)
        return m

    def all_paths(self) -> list[str]:
        out = [self.tokenizer.file]
        for b in self.backends.values():
            out += list(b.files)
        for t in self.tasks.values():
            out += [p.file for p in t.prefixes.values()]
        return out


def chat_template_of(root: Path, manifest: "Manifest") -> tuple[str | None, dict[str, Any]]:
    """The model's chat template and the special tokens it is rendered with, checked against
    the manifest's hash (in the fingerprint). Bundles from before the manifest kept the text
    read it from the tokenizer dir export wrote (chat_template.jinja or tokenizer_config.json)."""
    t = manifest.tokenizer
    if t.chat_template_sha256 is None:
        return None, {}
    text, special = t.chat_template, t.special_tokens
    tok_dir = (Path(root) / t.file).parent
    if text is None or special is None:
        try:
            cfg = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
            if text is None:
                jinja = tok_dir / "chat_template.jinja"
                text = jinja.read_text(encoding="utf-8") if jinja.is_file() else cfg.get("chat_template")
            if special is None:
                special = {k: (v.get("content") if isinstance(v, dict) else v) for k, v in cfg.items()
                           if k.endswith("_token") and isinstance(v, (str, dict))}
        except (OSError, ValueError) as e:
            raise PrefixEdgeError(f"bundle {root}: cannot read its chat template: {e}") from None
    if not isinstance(text, str) or hashlib.sha256(text.encode()).hexdigest() != t.chat_template_sha256:
        raise PrefixEdgeError(f"bundle {root}: its chat template does not match the manifest's "
                              "hash (edited or missing); re-export the bundle")
    return text, dict(special or {})


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def hash_files(root: Path, rel_paths) -> dict[str, str]:
    out = {}
    for rel in rel_paths:
        p = root / rel
        if not p.is_file():
            raise PrefixEdgeError(f"bundle {root}: model file {rel} is missing")
        out[rel] = sha256_file(p)
    return out
