"""The prefix-file codec: the one place that knows how a task's baked prefix is stored.

A prefix file is a safetensors file:

    prefix_ids                     int64 [P - n_virtual]: the text ids after the virtual tokens
    past_key_values.{i}.key|value  (onnx) [1, n_kv_heads, P, head_dim] in the graph's KV dtype
    state                          (gguf) uint8 [bytes]: llama.cpp's sequence-state blob

and string metadata (schema version PREFIX_FORMAT_VERSION):

    backend, fingerprint, task, task_digest, prefix_format_version, n_virtual (peft tasks),
    + onnx: kv_store (absent: the graph's dtype), + gguf: state_format, state_version, n_layer,
    v_trans, kv_type, n_tokens

The ONNX KV may be stored smaller than the graph computes it (`kv_store`, chosen at export):
"f16" (half the bytes), or "q8_0": int8 in blocks of 32 along head_dim (a whole row when head_dim
is no multiple of 32) with one f16 scale per block in `{name}.scale` — llama.cpp's Q8_0, 1.06
bytes per value. Both are decoded to the graph's dtype on load, so they are not bit-exact to a
prefilled prefix: their greedy agreement is measured (README, "Prefix storage").

Backends never open these files: `read` hands them the tensors and metadata; `write` is what
export's baking calls through the backends' save_prefix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import PrefixEdgeError

PREFIX_FORMAT_VERSION = "1"
IDS = "prefix_ids"
KV_STORES = ("f32", "f16", "q8_0")
Q8_BLOCK = 32
STATE = "state"
MAX_BYTES = 16 << 30


def read(path: Path, need: list[str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """All tensors (or the `need`ed ones, which must exist) and the metadata; one-line errors."""
    from safetensors import safe_open

    try:
        if Path(path).stat().st_size > MAX_BYTES:
            raise PrefixEdgeError(f"{path}: prefix file is larger than {MAX_BYTES >> 30} GB")
        with safe_open(str(path), framework="np") as f:
            meta = dict(f.metadata() or {})
            names = set(f.keys())
            for n in need or []:
                if n not in names:
                    raise PrefixEdgeError(f"{path}: prefix file lacks tensor {n!r}")
            tensors = {n: f.get_tensor(n) for n in (need or sorted(names))}
    except PrefixEdgeError:
        raise
    except Exception as e:  # safetensors' and numpy's own errors
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PrefixEdgeError(f"{path}: cannot read prefix file: {msg}") from None
    fmt = meta.get("prefix_format_version", PREFIX_FORMAT_VERSION)
    if fmt != PREFIX_FORMAT_VERSION:
        raise PrefixEdgeError(f"{path}: prefix file format {fmt!r}, this prefix-edge reads "
                              f"{PREFIX_FORMAT_VERSION!r}; re-export the bundle")
    return tensors, meta


def metadata(path: Path) -> dict[str, str]:
    """Only the metadata (no tensor is read)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            return dict(f.metadata() or {})
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PrefixEdgeError(f"{path}: cannot read prefix file: {msg}") from None


def require(tensors: dict, names: list[str], where: str) -> None:
    missing = [n for n in names if n not in tensors]
    if missing:
        raise PrefixEdgeError(f"{where}: prefix file lacks tensor {missing[0]!r}")


def read_ids(path: Path) -> np.ndarray:
    tensors, _ = read(path, [IDS])
    return ids_of(tensors[IDS], str(path))


def ids_of(t: np.ndarray, where: str) -> np.ndarray:
    if t.dtype.kind not in "iu" or t.ndim != 1:
        raise PrefixEdgeError(f"{where}: tensor {IDS!r} is {t.dtype}{list(t.shape)}, expected int64 [n]")
    return t.astype(np.int64)


def n_virtual(metadata: dict[str, str], where: str) -> int:
    """The `n_virtual` metadata (absent: 0), checked."""
    raw = metadata.get("n_virtual", "0")
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise PrefixEdgeError(f"{where}: metadata n_virtual is {raw!r}, not a count")
    return n


def write(path: Path, ids: np.ndarray, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    from safetensors.numpy import save_file

    out = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    out[IDS] = np.asarray(ids, np.int64).reshape(-1)
    meta = {k: str(v) for k, v in metadata.items()}
    meta.setdefault("prefix_format_version", PREFIX_FORMAT_VERSION)
    save_file(out, str(path), metadata=meta)


def _q8_block(head_dim: int) -> int:
    return Q8_BLOCK if head_dim % Q8_BLOCK == 0 else head_dim


def encode_kv(kv: dict[str, np.ndarray], store: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """ONNX KV tensors as stored: unchanged ("f32": the graph's own dtype), f16, or q8_0."""
    if store not in KV_STORES:
        raise PrefixEdgeError(f"unknown prefix store {store!r}; choose one of {', '.join(KV_STORES)}")
    if store == "f32":
        return dict(kv), {}
    from ..quantize.blocks import q8_0

    out = {}
    for name, a in kv.items():
        a = np.asarray(a, np.float32)
        if store == "f16":
            out[name] = a.astype(np.float16)
            continue
        q, scale = q8_0(a, _q8_block(a.shape[-1]), np.float16)
        out[name] = q.reshape(a.shape)
        out[name + ".scale"] = scale
    return out, {"kv_store": store}


def decode_kv(tensors: dict[str, np.ndarray], meta: dict[str, str], names: list[str], dtype,
              where: str) -> dict[str, np.ndarray]:
    """The KV tensors `names` in the graph's `dtype`, decoded from the file's kv_store; a tensor
    of another type or shape than its store says is refused (one line)."""
    store = meta.get("kv_store", "f32")
    if store not in KV_STORES:
        raise PrefixEdgeError(f"{where}: unknown kv_store {store!r} (this prefix-edge reads "
                              f"{', '.join(KV_STORES)}); re-export the bundle")
    require(tensors, names, where)
    if store == "f32":
        return {n: tensors[n] for n in names}
    out = {}
    for n in names:
        t = tensors[n]
        if store == "f16":
            if t.dtype != np.float16:
                raise PrefixEdgeError(f"{where}: tensor {n} is {t.dtype}, its kv_store f16 says float16")
            out[n] = t.astype(dtype)
            continue
        require(tensors, [n + ".scale"], where)
        scale = tensors[n + ".scale"]
        if t.dtype != np.int8 or t.ndim < 1 or scale.dtype != np.float16 \
                or scale.shape != (*t.shape[:-1], t.shape[-1] // _q8_block(t.shape[-1] or 1)):
            raise PrefixEdgeError(f"{where}: tensor {n} is {t.dtype}{list(t.shape)} with scales "
                                  f"{scale.dtype}{list(scale.shape)}: not q8_0 as its kv_store says")
        block = _q8_block(t.shape[-1])
        blocks = t.reshape(*t.shape[:-1], -1, block).astype(np.float32)
        out[n] = (blocks * scale.astype(np.float32)[..., None]).reshape(t.shape).astype(dtype)
    return out
