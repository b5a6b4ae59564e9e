"""A saved conversation is user input: `rt.resume` and `conv.save` answer every malformed file or
path with one PrefixEdgeError line (never a TypeError, RecursionError, OverflowError or the
safetensors library's own error). A seeded, bounded fuzz of a real saved file: truncations, bit
flips, every metadata field and tensor entry given wrong JSON types, deep JSON. A file that
still loads gives a conversation that answers; the unchanged file answers as the same history
run cold (the reference)."""

from __future__ import annotations

import json
import random

import pytest

from prefix_edge import PrefixEdgeError, Runtime

WRONG = [None, 1, -1, 2 ** 70, 1.5, True, "x", [], {}, [1, [2]], {"a": 1}, "[1e400]", "[Infinity]", "[NaN]",
         "[" * 3000 + "]" * 3000, "[-1]", "[99999999]", "1", "null", '{"a": 1}', '[{"role": "user", "content": 5}]',
         '["x"]', "[1, 2]", "[[1]]", '"str"', '[{"role": "robot", "content": "x"}]']


def _header(raw: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _file(header, data: bytes) -> bytes:
    head = json.dumps(header).encode()
    return len(head).to_bytes(8, "little") + head + data


def _cases(raw: bytes, seed: int) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    header, data = _header(raw)
    out = [(f"truncated at {n}", raw[:n]) for n in sorted(rng.sample(range(9, len(raw)), 12)) + [0, 7, 8]]
    for _ in range(30):
        b = bytearray(raw)
        at = rng.randrange(len(b))
        b[at] ^= 1 << rng.randrange(8)
        out.append((f"bit flip at {at}", bytes(b)))
    for key in sorted(header["__metadata__"]):
        for value in rng.sample(WRONG, 8) + ["[" * 3000 + "]" * 3000]:
            h = json.loads(json.dumps(header))
            h["__metadata__"][key] = value
            out.append((f"metadata {key} = {str(value)[:24]}", _file(h, data)))
    for name in (k for k in header if k != "__metadata__"):
        for field in ("dtype", "shape", "data_offsets"):
            for value in (None, 1, [], ["F32"], [0, 0], [2 ** 63], [-1], {"a": 1}, [1.5], "I64", "U8"):
                h = json.loads(json.dumps(header))
                h[name][field] = value
                out.append((f"{name}.{field} = {value}", _file(h, data)))
    out += [("metadata a list", _file({**header, "__metadata__": [1]}, data)),
            ("deep header", _file({"a": json.loads("[" * 900 + "]" * 900)}, b"")),
            ("deeper header", (200000).to_bytes(8, "little") + b"[" * 100000 + b"]" * 100000)]
    return out


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_malformed_conversation_files(bundle_fp32, tmp_path, backend):
    with Runtime.open(bundle_fp32, backend=backend, slots=1) as rt:
        conv = rt.chat("support")
        conv.send("my sync stopped", max_tokens=4)
        good = tmp_path / "good.pe"
        assert conv.save(good)
        # the unchanged file: the next turn answers as the whole history run cold
        again = rt.resume(good)
        assert again.kv_restored and again.messages == conv.messages
        ref = rt.generate("support", messages=conv.messages + [{"role": "user", "content": "and now?"}],
                          max_tokens=6, use_prefix_cache=False, use_prompt_cache=False)
        assert again.send("and now?", max_tokens=6).text == ref.text
        loaded = 0
        for label, raw in _cases(good.read_bytes(), seed=40):
            path = tmp_path / "case.pe"
            path.write_bytes(raw)
            try:
                c = rt.resume(path)
            except PrefixEdgeError as e:
                assert "\n" not in str(e), label
                continue
            loaded += 1  # what loads is a working conversation: it saves and answers
            c.save(tmp_path / "resaved.pe")
            assert isinstance(c.send("and then?", max_tokens=2).text, str), label
        assert loaded  # some changes keep a valid file (a flipped byte in the KV, the messages' text)


def test_bad_paths(bundle_fp32, tmp_path):
    with Runtime.open(bundle_fp32, backend="gguf", slots=1) as rt:
        conv = rt.chat("support")
        conv.send("hi", max_tokens=2)
        for target, needle in ((tmp_path, "directory"), (tmp_path / "missing" / "c.pe", "does not exist"),
                               ("", "directory"), (5, "must be a path"), (None, "must be a path")):
            with pytest.raises(PrefixEdgeError, match=needle) as e:
                conv.save(target)
            assert "\n" not in str(e.value)
        for target in (tmp_path, tmp_path / "missing.pe", "", 5, None, "/dev/null"):
            with pytest.raises(PrefixEdgeError) as e:
                rt.resume(target)
            assert "\n" not in str(e.value)


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_a_signed_conversation_loads_only_as_this_home_wrote_it(bundle_fp32, tmp_path, backend, monkeypatch):
    """save(signed=True) / resume(signed=True): the file carries a MAC under this home's secret.
    It loads (KV restored, the next turn as the history run cold); the same file edited by a
    writer without the secret (its KV changed, the CRC-32 recomputed), a file saved unsigned,
    and one signed in another home are each refused in one line; resume(signed=False) still
    reads a signed file (its MAC is then not asked for)."""
    import numpy as np

    from prefix_edge.bundle import prefixfile

    monkeypatch.setenv("PREFIX_EDGE_HOME", str(tmp_path / "home"))
    with Runtime.open(bundle_fp32, backend=backend, slots=1) as rt:
        conv = rt.chat("support")
        conv.send("my sync stopped", max_tokens=4)
        signed, plain = tmp_path / "signed.pe", tmp_path / "plain.pe"
        assert conv.save(signed, signed=True) and conv.save(plain)
        again = rt.resume(signed, signed=True)
        ref = rt.generate("support", messages=conv.messages + [{"role": "user", "content": "and now?"}],
                          max_tokens=6, use_prefix_cache=False, use_prompt_cache=False)
        assert again.kv_restored and again.send("and now?", max_tokens=6).text == ref.text
        assert rt.resume(signed).kv_restored  # unsigned reading ignores the MAC

        tensors, meta = prefixfile.read(signed, verify=True)
        forged = {k: v.copy() for k, v in tensors.items() if k != prefixfile.IDS}
        for t in forged.values():
            if t.dtype != np.uint8:
                t += np.float32(0.25).astype(t.dtype)
        keep = {k: v for k, v in meta.items() if k not in (prefixfile.CHECKSUM, prefixfile.MAC)}
        prefixfile.write(tmp_path / "forged.pe", tensors[prefixfile.IDS], forged, keep)
        prefixfile.write(tmp_path / "other-key.pe", tensors[prefixfile.IDS], forged, keep, bytes(32))
        for path, needle in ((tmp_path / "forged.pe", "carries no MAC"), (plain, "carries no MAC"),
                             (tmp_path / "other-key.pe", "its MAC does not match")):
            with pytest.raises(PrefixEdgeError, match=needle) as e:
                rt.resume(path, signed=True)
            assert "\n" not in str(e.value)
        monkeypatch.setenv("PREFIX_EDGE_HOME", str(tmp_path / "another-home"))
        with pytest.raises(PrefixEdgeError, match="its MAC does not match"):
            rt.resume(signed, signed=True)
