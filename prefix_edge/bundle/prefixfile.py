"""The prefix-file codec: the one place that knows how a task's baked prefix is stored.

A prefix file is a safetensors file:

    prefix_ids                     int64 [P - n_virtual]: the text ids after the virtual tokens
    past_key_values.{i}.key|value  (onnx) [1, n_kv_heads, P, head_dim] in the graph's KV dtype
    state                          (gguf) uint8 [bytes]: llama.cpp's sequence-state blob

and string metadata (schema version PREFIX_FORMAT_VERSION):

    backend, fingerprint, task, task_digest, prefix_format_version, n_virtual (peft tasks),
    + onnx: kv_store (absent: the graph's dtype), + gguf: state_format, state_version, n_layer,
    v_trans, kv_type, n_tokens, + payload_crc32 (every file written since 2026-12-03)

`payload_crc32` is a CRC-32 of the whole payload: every tensor's name, dtype, shape and bytes,
and the rest of the metadata. A file read back from outside a bundle (a saved conversation, the
prompt cache's files) is read with `verify=True`: a flipped bit anywhere is a one-line refusal,
never a different answer. A bundle's prefix files are covered by the bundle's own hashes
(bundle/verify.py) and read without it (a CRC pass would double a restore's time).

A CRC catches damage, not a writer: anyone who can write the file can recompute it. A file
written with a `mac_key` (the prompt cache's files, a conversation saved `signed=True`) also
carries `payload_mac`, a keyed BLAKE2b-256 of the same payload with the home's secret
(paths.secret_key: 32 random bytes, mode 0600); read with the key, a file without it or with
another is refused, before any of it is used. An untrusted file (`verify=True`) is opened
without following a symbolic link and without blocking (a FIFO), must be a regular file
(fstat on the open descriptor), and a reader that knows how large the file can be
(`max_bytes`: the prompt cache, from the positions its header names) refuses a larger one
before reading it.

The ONNX KV may be stored smaller than the graph computes it (`kv_store`, chosen at export):
"f16" (half the bytes), or "q8_0": int8 in blocks of 32 along head_dim (a whole row when head_dim
is no multiple of 32) with one f16 scale per block in `{name}.scale` — llama.cpp's Q8_0, 1.06
bytes per value. Both are decoded to the graph's dtype on load, so they are not bit-exact to a
prefilled prefix: their greedy agreement is measured (README, "Prefix storage").

Backends never open these files: `read` hands them the tensors and metadata; `write` is what
export's baking calls through the backends' save_prefix.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import math
import os
import stat
import zlib
from pathlib import Path

import numpy as np

from ..errors import PrefixEdgeError

PREFIX_FORMAT_VERSION = "1"
IDS = "prefix_ids"
KV_STORES = ("f32", "f16", "q8_0")
Q8_BLOCK = 32
STATE = "state"
CHECKSUM = "payload_crc32"
MAC = "payload_mac"
MAX_BYTES = 16 << 30


_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
           "I8": "i1", "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8", "BOOL": "?"}
MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header


def _header(f, path: Path, size: int) -> tuple[dict, int]:
    """The safetensors JSON header and the data section's offset in the file."""
    import json

    head = f.read(8)
    if len(head) != 8:
        raise PrefixEdgeError(f"{path}: cannot read prefix file: shorter than its header")
    n = int.from_bytes(head, "little")
    if n > min(MAX_HEADER, size - 8):
        raise PrefixEdgeError(f"{path}: cannot read prefix file: header length {n} does not fit the file")
    try:
        header = json.loads(f.read(n))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise PrefixEdgeError(f"{path}: cannot read prefix file: its header is not valid JSON") from None
    if not isinstance(header, dict):
        raise PrefixEdgeError(f"{path}: cannot read prefix file: its header is not an object")
    return header, 8 + n


def checksum(tensors: dict[str, np.ndarray], meta: dict[str, str]) -> str:
    """The payload's CRC-32: tensors (name, dtype, shape, bytes) in name order, then the
    metadata but this field and the MAC, as sorted JSON."""
    return _digests(tensors, meta, None)[0]


def _digests(tensors: dict[str, np.ndarray], meta: dict[str, str], key: bytes | None) -> tuple[str, str | None]:
    """(CRC-32, keyed BLAKE2b-256 or None) of the payload, in one pass over its bytes."""
    c = 0
    h = hashlib.blake2b(key=key, digest_size=32) if key else None
    for name in sorted(tensors):
        t = np.ascontiguousarray(tensors[name])
        head = f"{name}|{t.dtype.str}|{list(t.shape)}|".encode()
        body = t.reshape(-1).view(np.uint8)
        c = zlib.crc32(body, zlib.crc32(head, c))
        if h is not None:
            h.update(head)
            h.update(body)
    rest = json.dumps({k: v for k, v in meta.items() if k not in (CHECKSUM, MAC)}, sort_keys=True).encode()
    if h is not None:
        h.update(rest)
    return f"{zlib.crc32(rest, c):08x}", (h.hexdigest() if h is not None else None)


def _open(path: Path, untrusted: bool):
    """(the file opened for reading, its size). untrusted: no symbolic link followed, no
    blocking open (a FIFO), a regular file only; the size is the open file's (fstat)."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    if untrusted:
        flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if untrusted and e.errno == errno.ELOOP:
            raise PrefixEdgeError(f"{path}: a symbolic link; refused (an untrusted file is read "
                                  "only as a regular file)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PrefixEdgeError(f"{path}: not a regular file; refused")
        return os.fdopen(fd, "rb", buffering=0), st.st_size
    except BaseException:
        os.close(fd)
        raise


def read(path: Path, need: list[str] | None = None, verify: bool = False, mac_key: bytes | None = None,
         max_bytes: int | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """All tensors (or the `need`ed ones, which must exist) and the metadata; one-line errors.
    verify: an untrusted file (opened as _open says); it must carry its payload checksum, and
    it must match (all tensors read). mac_key: it must carry the payload's MAC with this key.
    max_bytes: a larger file is refused before it is read.

    The safetensors layout (what safetensors.numpy.save_file wrote at export), read in ONE
    readinto of the data section (with `need`: of the span those tensors lie in) into a buffer
    the tensors are views of, after the header's
    every entry is checked (dtype, shape, offsets inside the data, no gap or overlap): a prefix
    is read from the page cache at memory speed, once, and owned by the process (a later write
    to the file cannot change what was read)."""
    path = Path(path)
    try:
        f, size = _open(path, verify or mac_key is not None)
        with f:
            if size > MAX_BYTES:
                raise PrefixEdgeError(f"{path}: prefix file is larger than {MAX_BYTES >> 30} GB")
            if max_bytes is not None and size > max_bytes:
                raise PrefixEdgeError(f"{path}: the file is {size} bytes, more than the {max_bytes} its "
                                      "header's positions can take")
            header, start = _header(f, path, size)
            entries = _entries(header, path, size - start)
            for n in need or []:
                if n not in entries:
                    raise PrefixEdgeError(f"{path}: prefix file lacks tensor {n!r}")
            names = need or sorted(entries)
            if need:  # only those tensors' bytes (e.g. the ids of a large prefix)
                lo, hi = min(entries[n][2] for n in need), max(entries[n][3] for n in need)
            else:
                lo, hi = 0, size - start
            f.seek(start + lo)
            data = np.empty(hi - lo, np.uint8)
            if f.readinto(memoryview(data)) != data.size:
                raise PrefixEdgeError(f"{path}: cannot read prefix file: it changed while being read")
    except PrefixEdgeError:
        raise
    except OSError as e:
        raise PrefixEdgeError(f"{path}: cannot read prefix file: {e.strerror or e}") from None
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise PrefixEdgeError(f"{path}: cannot read prefix file: its metadata is not a string map")
    tensors = {}
    for name in names:
        dtype, shape, a, b = entries[name]
        raw = data[a - lo:b - lo]
        t = raw.view(dtype) if (a - lo) % np.dtype(dtype).itemsize == 0 else raw.copy().view(dtype)
        tensors[name] = t.reshape(shape)
    if verify or mac_key is not None:
        if need:
            raise PrefixEdgeError("internal error: a checksum covers the whole file")
        if CHECKSUM not in meta:
            raise PrefixEdgeError(f"{path}: this file carries no checksum (written before 2026-12-03 "
                                  "or not by prefix-edge): it cannot be trusted")
        if mac_key is not None and MAC not in meta:
            raise PrefixEdgeError(f"{path}: this file carries no MAC (not written by this prefix-edge "
                                  "home, or written unsigned): it cannot be trusted")
        crc, mac = _digests(tensors, meta, mac_key)
        if crc != meta[CHECKSUM]:
            raise PrefixEdgeError(f"{path}: the file is damaged (its checksum does not match its contents)")
        if mac is not None and not hmac.compare_digest(mac, meta[MAC]):
            raise PrefixEdgeError(f"{path}: its MAC does not match (written by someone without this "
                                  "home's secret, or edited): it cannot be trusted")
    fmt = meta.get("prefix_format_version", PREFIX_FORMAT_VERSION)
    if fmt != PREFIX_FORMAT_VERSION:
        raise PrefixEdgeError(f"{path}: prefix file format {fmt!r}, this prefix-edge reads "
                              f"{PREFIX_FORMAT_VERSION!r}; re-export the bundle")
    return tensors, dict(meta)


def _entries(header: dict, path: Path, n_data: int) -> dict[str, tuple]:
    """name -> (dtype, shape, start, end) for every tensor, checked as safetensors checks them."""
    out, spans = {}, []
    for name, e in header.items():
        if name == "__metadata__":
            continue
        ok = isinstance(e, dict) and isinstance(e.get("dtype"), str) and e["dtype"] in _DTYPES \
            and isinstance(e.get("shape"), list) \
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in e["shape"]) \
            and isinstance(e.get("data_offsets"), list) and len(e["data_offsets"]) == 2 \
            and all(isinstance(x, int) and not isinstance(x, bool) for x in e["data_offsets"])
        if not ok:
            raise PrefixEdgeError(f"{path}: cannot read prefix file: tensor {name!r} has a malformed entry")
        lo, hi = e["data_offsets"]
        dtype = _DTYPES[e["dtype"]]
        if not 0 <= lo <= hi <= n_data or hi - lo != math.prod(e["shape"]) * np.dtype(dtype).itemsize:
            raise PrefixEdgeError(f"{path}: cannot read prefix file: tensor {name!r} does not fit its "
                                  "offsets or the file")
        out[name] = (dtype, tuple(e["shape"]), lo, hi)
        spans.append((lo, hi))
    end = 0
    for lo, hi in sorted(spans):
        if lo != end:
            raise PrefixEdgeError(f"{path}: cannot read prefix file: its tensors overlap or leave a gap")
        end = hi
    if end != n_data:
        raise PrefixEdgeError(f"{path}: cannot read prefix file: {n_data - end} bytes after its tensors")
    return out


def metadata(path: Path, untrusted: bool = False) -> dict[str, str]:
    """Only the metadata (no tensor is read). untrusted: opened as _open says."""
    path = Path(path)
    try:
        f, size = _open(path, untrusted)
        with f:
            header, _ = _header(f, path, size)
    except OSError as e:
        raise PrefixEdgeError(f"{path}: cannot read prefix file: {e.strerror or e}") from None
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise PrefixEdgeError(f"{path}: cannot read prefix file: its metadata is not a string map")
    return {str(k): str(v) for k, v in meta.items()}


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


def write(path: Path, ids: np.ndarray, tensors: dict[str, np.ndarray], metadata: dict[str, str],
          mac_key: bytes | None = None) -> None:
    """mac_key: the payload's MAC with it too (read back with the same key only)."""
    from safetensors.numpy import save_file

    out = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    out[IDS] = np.asarray(ids, np.int64).reshape(-1)
    meta = {k: str(v) for k, v in metadata.items() if k not in (CHECKSUM, MAC)}
    meta.setdefault("prefix_format_version", PREFIX_FORMAT_VERSION)
    meta[CHECKSUM], mac = _digests(out, meta, mac_key)
    if mac is not None:
        meta[MAC] = mac
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
        from ..quantize.blocks import q8_0_values

        out[n] = q8_0_values(t.reshape(*t.shape[:-1], -1, _q8_block(t.shape[-1])), scale).astype(dtype)
    return out
