"""A seeded mutation harness over whole bundles, both backends: every mutated bundle must end as a
one-line refusal (PrefixEdgeError) or give exactly the unmutated bundle's output — never a
crash, a hang, a traceback or a different answer.

PREFIX_EDGE_FUZZ_CASES=N sets the number of cases (default 300; the closing note's run: 2000).
The outcome table is printed (pytest -s) and written to $PREFIX_EDGE_FUZZ_REPORT if set.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
from collections import Counter
from pathlib import Path

import numpy as np

from prefix_edge import PrefixEdgeError, Runtime
from prefix_edge.bundle import sha256_file

from .conftest import INPUTS

BACKENDS = ["onnx", "gguf"]
PROBE_TASKS = ["support", "sentiment", "extract", "raw"]  # every task of the bundle
CLASSES = ["manifest_edit", "manifest_delete", "manifest_bytes", "path_escape", "prefix_flip_header",
           "prefix_flip_data", "prefix_truncate", "prefix_extend", "prefix_swap", "prefix_foreign",
           "nan_kv", "model_flip", "tokenizer_flip", "deep_json"]


def _outputs(bundle: Path, backend: str) -> dict:
    with Runtime.open(bundle, backend=backend, slots=1) as rt:
        out = {}
        for t in PROBE_TASKS:
            r = rt.generate(t, INPUTS[1], max_tokens=6, timeout=60)
            assert r.stats.finish_reason != "timeout", "hang"
            out[t] = r.tokens
        return out


def _leaves(d, path=()):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(d, list) and d:
        for i, v in enumerate(d):
            yield from _leaves(v, path + (i,))
    yield path


def _get(d, path):
    for k in path:
        d = d[k]
    return d


def _set(d, path, value):
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


def _weird(rng: random.Random, old):
    choices = [None, True, -1, 0, 2**63, 1.5, float("nan"), "", "x" * 3, [], {}, [1, "a"], {"a": 1},
               "../../etc/passwd", "0" * 64]
    if isinstance(old, bool):
        choices.append(not old)
    elif isinstance(old, int):
        choices += [old + 1, old - 1, str(old)]
    elif isinstance(old, float):
        choices += [old * 2, str(old)]
    elif isinstance(old, str):
        choices += [old + "x", old[:-1], old.upper()]
    return rng.choice(choices)


def _prefix_files(b: Path, backend: str | None = None) -> list[Path]:
    return sorted(p for p in (b / "tasks").glob("*.safetensors") if backend is None or f".{backend}." in p.name)


def _refresh_entry(b: Path, rel: str) -> None:
    """Make the manifest's entry for a prefix file match its new bytes (so deeper checks run)."""
    m = json.loads((b / "manifest.json").read_text())
    for t in m["tasks"].values():
        for e in t["prefixes"].values():
            if e["file"] == rel:
                e.update(sha256=sha256_file(b / rel), bytes=(b / rel).stat().st_size)
    (b / "manifest.json").write_text(json.dumps(m))


def _flip(path: Path, rng: random.Random, lo: int, hi: int) -> None:
    data = bytearray(path.read_bytes())
    hi = min(hi, len(data))
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(lo, hi)
        data[i] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def _nan_kv(b: Path, rng: random.Random) -> None:
    from safetensors import safe_open
    from safetensors.numpy import save_file

    p = rng.choice(_prefix_files(b))
    with safe_open(str(p), framework="np") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if "state" in tensors:  # llama.cpp blob: NaN/inf (f16) into one layer's K or V data
        from prefix_edge.llamacpp.seqstate import parse_seq_state

        blob = bytearray(tensors["state"].tobytes())
        info = parse_seq_state(bytes(blob))
        lay = rng.choice(info.layers)
        off = rng.choice([lay.k_offset, lay.v_offset])
        struct.pack_into("<H", blob, off + 2 * rng.randrange(4), rng.choice([0x7E00, 0x7C00, 0xFC00]))
        tensors["state"] = np.frombuffer(bytes(blob), np.uint8)
    else:
        k = rng.choice([k for k in tensors if k.startswith("past_key_values")])
        t = tensors[k].copy()
        t.reshape(-1)[rng.randrange(t.size)] = rng.choice([np.nan, np.inf, -np.inf])
        tensors[k] = t
    save_file(tensors, str(p), metadata=meta)
    _refresh_entry(b, f"tasks/{p.name}")


def mutate(b: Path, cls: str, rng: random.Random, foreign: Path) -> None:
    man = b / "manifest.json"
    if cls in ("manifest_edit", "manifest_delete", "path_escape"):
        m = json.loads(man.read_text())
        if cls == "path_escape":
            targets = [("tokenizer", "file")] + [("backends", k, "files") for k in m["backends"]] + \
                      [("tasks", t, "prefixes", bk, "file") for t in m["tasks"] for bk in m["tasks"][t]["prefixes"]]
            path = rng.choice(targets)
            bad = rng.choice(["../" + b.name + "/manifest.json", "/etc/passwd", "tasks/../../x",
                              str(b / "manifest.json"), "~/x", "tasks\\..\\x", "link/escape"])
            if bad == "link/escape":
                (b / "link").symlink_to("/")
            if path[-1] == "files":
                files = _get(m, path)
                k = rng.choice(list(files))
                files[bad] = files.pop(k)
            else:
                _set(m, path, bad)
        else:
            paths = [p for p in _leaves(m) if p]
            path = rng.choice(paths)
            if cls == "manifest_delete":
                parent = _get(m, path[:-1])
                if isinstance(parent, dict):
                    del parent[path[-1]]
                else:
                    parent.pop(path[-1])
            else:
                _set(m, path, _weird(rng, _get(m, path)))
        man.write_text(json.dumps(m))
    elif cls == "manifest_bytes":
        _flip(man, rng, 0, man.stat().st_size)
    elif cls == "deep_json":
        man.write_text("[" * 100000 + "]" * 100000)
    elif cls in ("prefix_flip_header", "prefix_flip_data", "prefix_truncate", "prefix_extend"):
        p = rng.choice(_prefix_files(b))
        n = p.stat().st_size
        if cls == "prefix_flip_header":
            _flip(p, rng, 0, min(n, 8 + int.from_bytes(p.read_bytes()[:8], "little")))
        elif cls == "prefix_flip_data":
            _flip(p, rng, min(n - 1, 8 + int.from_bytes(p.read_bytes()[:8], "little")), n)
        elif cls == "prefix_truncate":
            p.write_bytes(p.read_bytes()[: rng.randrange(n)])
        else:
            p.write_bytes(p.read_bytes() + os.urandom(rng.randint(1, 64)))
        # half the time the manifest entry is made to match the new bytes, so the checks behind
        # the hash run too; not for flipped KV *data*: a KV file and its manifest entry changed
        # together is a different bundle, which no check can tell without a signature
        if cls != "prefix_flip_data" and rng.random() < 0.5:
            _refresh_entry(b, f"tasks/{p.name}")
    elif cls == "prefix_swap":
        backend = rng.choice(BACKENDS)
        a, c = rng.sample(_prefix_files(b, backend), 2)
        ta, tc = a.read_bytes(), c.read_bytes()
        a.write_bytes(tc)
        c.write_bytes(ta)
        if rng.random() < 0.5:
            _refresh_entry(b, f"tasks/{a.name}")
            _refresh_entry(b, f"tasks/{c.name}")
    elif cls == "prefix_foreign":
        p = rng.choice(_prefix_files(b))
        shutil.copy(foreign / "tasks" / p.name, p)
        if rng.random() < 0.5:
            _refresh_entry(b, f"tasks/{p.name}")
    elif cls == "nan_kv":
        _nan_kv(b, rng)
    elif cls == "model_flip":
        f = rng.choice([b / "onnx" / "model.onnx", b / "gguf" / "model.gguf"])
        _flip(f, rng, 0, f.stat().st_size)
    elif cls == "tokenizer_flip":
        f = b / "tokenizer" / "tokenizer.json"
        _flip(f, rng, 0, f.stat().st_size)


def test_fuzzed_bundles_refuse_or_match(bundle_int4, bundle_fp32, tmp_path):
    n_cases = int(os.environ.get("PREFIX_EDGE_FUZZ_CASES", "300"))
    ref = {b: _outputs(bundle_int4, b) for b in BACKENDS}
    rng = random.Random(20261130)
    table: Counter = Counter()
    failures = []
    for i in range(n_cases):
        cls = CLASSES[i % len(CLASSES)]
        case = tmp_path / f"c{i}"
        shutil.copytree(bundle_int4, case, symlinks=True)
        mutate(case, cls, rng, bundle_fp32)
        for backend in BACKENDS:
            try:
                got = _outputs(case, backend)
            except PrefixEdgeError as e:
                msg = str(e)
                if "\n" in msg or not msg:
                    failures.append((i, cls, backend, "multi-line error", msg[:300]))
                table[(cls, "refused")] += 1
                continue
            except Exception as e:  # a traceback, not a refusal
                failures.append((i, cls, backend, type(e).__name__, str(e)[:300]))
                table[(cls, "traceback")] += 1
                continue
            if got == ref[backend]:
                table[(cls, "same output")] += 1
            else:
                failures.append((i, cls, backend, "different output", ""))
                table[(cls, "DIFFERENT")] += 1
        shutil.rmtree(case, ignore_errors=True)
    report = {c: {k[1]: n for k, n in table.items() if k[0] == c} for c in CLASSES}
    lines = [f"{c:20s} " + "  ".join(f"{k}={v}" for k, v in sorted(r.items())) for c, r in report.items()]
    print(f"\nfuzz: {n_cases} cases x {len(BACKENDS)} backends\n" + "\n".join(lines))
    if os.environ.get("PREFIX_EDGE_FUZZ_REPORT"):
        Path(os.environ["PREFIX_EDGE_FUZZ_REPORT"]).write_text(json.dumps(
            {"cases": n_cases, "backends": BACKENDS, "by_class": report, "failures": failures}, indent=1))
    assert not failures, failures[:10]
    assert sum(n for (c, k), n in table.items() if k == "refused") > n_cases // 2  # it did bite
