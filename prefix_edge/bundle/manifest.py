"""The typed manifest (manifest.json): its dataclasses, the fingerprint and task digest,
read (schema-checked by check.py, every path confined) and write."""


from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PrefixEdgeError

from .layout import MANIFEST, confined

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
    sliding_layers: list[int] = field(default_factory=list)  # layers attending to a window only
    sliding_window: int = 0                                 # of this many positions (Gemma 3)


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
    # a compressed prefix (export --compress-prefix): method, ratio, source_tokens, kept_tokens,
    # kept (positions of the source prefix), source_ids, reconstruction_agreement
    compression: dict[str, Any] | None = None
    # sha256 of the prefix's text ids (int64): two tasks of one name whose prefix text differs
    # differ in their digest (and the caches' keys: runtime/prepare.py cache_root); None in
    # bundles made before it (their tasks are fixed by their bundle)
    prefix_sha256: str | None = None

    @property
    def source_ids(self) -> list[int] | None:
        """A compressed prefix's whole text ids (what prefilling the task means), else None."""
        return list(self.compression["source_ids"]) if self.compression else None

    def positions(self, restored: bool = True) -> int:
        """KV positions the prefix takes in a request: its baked ones when restored, else what
        prefilling it takes (a compressed prefix's whole source)."""
        if not restored and self.compression:
            return self.n_virtual + len(self.compression["source_ids"])
        return self.prefix_tokens

    def compression_summary(self) -> dict[str, Any] | None:
        """The compression record without its long lists (kept positions, source ids)."""
        if not self.compression:
            return None
        return {k: v for k, v in self.compression.items() if k not in ("kept", "source_ids")}


def task_digest(name: str, info: TaskInfo) -> str:
    """What a task's answers depend on besides the model: everything in its manifest entry
    but the prefix files themselves (Manifest.task_digest; a created task's before it is in one)."""
    d = asdict(info)
    d.pop("prefixes")
    for key in ("chat_messages", "compression", "prefix_sha256"):  # fields newer than format 2:
        if d.get(key) is None:                                     # in the digest once set
            d.pop(key, None)
    d = json.loads(json.dumps({"task": name, **d}))  # as the manifest file spells it
    return hashlib.sha256(json.dumps(d, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


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
        model = asdict(self.model)
        for key in ("sliding_layers", "sliding_window"):  # fields newer than format 2: in the
            if not model[key]:                            # fingerprint once set
                model.pop(key)
        doc = {
            "format_version": self.format_version,
            "backend": backend,
            "model_files": dict(sorted((file_hashes or b.files).items())),
            "model": model,  # every model fact, n_ctx and eos ids included
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
        return task_digest(task, self.tasks[task])

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
