"""The prompt cache's persistent tier (runtime/cache/prompt_files.py): a prompt start that keeps coming
back is written to disk, and a new runtime on the same home starts warm.

References: the same request with the cache off (`use_prompt_cache=False`) in the same runtime.
A file that is damaged (seeded bit flips, truncated), from another model, or whose ids do not
match its keys must be a miss with the uncached answer, one warning, and gone from the disk.
"""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest

from prefix_edge import Runtime
from prefix_edge.bundle import prefixfile
from prefix_edge.paths import prompt_cache_dir, secret_key
from prefix_edge.runtime.cache.prompt_files import INDEX_CRC, SUFFIX, _index_crc
from prefix_edge.serve.metrics import Metrics

from .helpers.serve import metrics, start_server, stop_server

BACKENDS = ["onnx", "gguf"]
CHUNK = 16
DOC = ("The Orion desk lamp ships from Porto in three days; its warranty is two years and the shade "
       "is aluminium. Returns are free within thirty days of delivery. The Vega kettle holds 1.7 "
       "litres, boils in four minutes and switches off by itself.")
OTHER = ["The Lyra chair folds flat, carries 120 kg and weighs five kilos; its frame is oak and the "
         "seat is woven cord, assembled in ten minutes.",
         "The Nova fan has three speeds, a timer of eight hours and a remote; it is quiet at night "
         "and folds into a box of forty centimetres.",
         "The Atlas backpack holds twenty-two litres, has a laptop sleeve and a rain cover, and its "
         "straps are padded with recycled foam."]
QUESTIONS = ["How long is the warranty?", "What colours are there?", "How much does it weigh?",
             "Where does it ship from?"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIX_EDGE_HOME", str(tmp_path))
    return tmp_path


def _open(bundle, backend, **kw) -> Runtime:
    kw = {"prompt_cache_disk_bytes": 64 << 20, "prompt_cache_disk_tokens": CHUNK, **kw}
    return Runtime.open(bundle, backend=backend, prefill_chunk=CHUNK, **kw)


def _text(doc: str, q: str) -> str:
    return f"{doc}\n\nQuestion: {q}"


def _system(doc: str, q: str) -> list:
    return [{"role": "system", "content": "Answer from this document.\n\n" + doc},
            {"role": "user", "content": q}]


def _folder(rt: Runtime):
    return prompt_cache_dir(rt.fingerprint, rt.backend.name)


def _files(folder) -> list:
    return sorted(folder.glob("*" + SUFFIX))


def _same(got, ref) -> None:
    assert got.tokens == ref.tokens and got.logprobs == ref.logprobs


def _asked_twice(rt: Runtime) -> tuple:
    """A new question on DOC with the prompt cache (and its files), then without: (got, ref)."""
    got = rt.generate("support", _text(DOC, QUESTIONS[3]), max_tokens=8, logprobs=2)
    ref = rt.generate("support", _text(DOC, QUESTIONS[3]), max_tokens=8, logprobs=2, use_prompt_cache=False)
    return got, ref


def _write_three(rt: Runtime, doc: str = DOC) -> None:
    """The same document with three questions: hit twice at the document's chunks (written)."""
    for q in QUESTIONS[:3]:
        rt.generate("support", _text(doc, q), max_tokens=2)
    rt.prompts.files.flush()


# -- warm start -----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_a_new_runtime_starts_warm(bundle_int4, backend, home):
    """A task's text input and the base model with the document in its system message: each
    written after its second hit; a NEW runtime answers a new question from the files, with the
    tokens and log-probabilities of an uncached run; the files stay for the next one."""
    with _open(bundle_int4, backend) as rt:
        _write_three(rt)
        for q in QUESTIONS[:3]:
            rt.generate(None, messages=_system(DOC, q), max_tokens=2)
        rt.prompts.files.flush()
        info = rt.engine_info()["prompt_cache"]
        assert info["disk_writes"] == 2 and info["disk_files"] == 2 and info["disk_loads"] == 0
    assert len(_files(_folder(rt))) == 2
    for _ in range(2):  # twice: loading a file copies it, the next runtime finds it too
        with _open(bundle_int4, backend) as rt:
            P = rt.manifest.tasks["support"].prefix_tokens
            n_doc = len(rt.tokenizer.encode(DOC + "\n\nQuestion:", add_special_tokens=False).ids)
            got = rt.generate("support", _text(DOC, QUESTIONS[3]), max_tokens=8, logprobs=2)
            ref = rt.generate("support", _text(DOC, QUESTIONS[3]), max_tokens=8, logprobs=2,
                              use_prompt_cache=False)
            _same(got, ref)
            assert got.stats.cached_tokens >= P + n_doc - CHUNK and ref.stats.cached_tokens == P
            msgs = _system(DOC, QUESTIONS[3])
            got = rt.generate(None, messages=msgs, max_tokens=8, logprobs=2)
            ref = rt.generate(None, messages=msgs, max_tokens=8, logprobs=2, use_prompt_cache=False)
            _same(got, ref)
            _, cuts, _ = rt.chat_input(None, msgs)
            assert got.stats.cached_tokens == cuts[0]  # the whole system message
            info = rt.engine_info()["prompt_cache"]
            assert info["disk_loads"] == 2 and info["disk_refused"] == 0 and info["disk_writes"] == 0
            text = Metrics().render(rt.engine_info())
            assert "prefix_edge_prompt_cache_disk_loads_total 2" in text
            assert "prefix_edge_prompt_cache_disk_files 2" in text
        assert len(_files(_folder(rt))) == 2


# -- bad files --------------------------------------------------------------------------------

def _rewrite(src, dst, edit, key: bytes | None = None) -> None:
    """dst: src's tensors and metadata after `edit(ids, tensors, meta)`, written as a well-formed
    file (its checksums those of what it now holds; its MAC with `key`, where given)."""
    tensors, meta = prefixfile.read(src, verify=True)
    ids = tensors.pop(prefixfile.IDS).copy()
    tensors = {k: v.copy() for k, v in tensors.items()}
    meta = {k: v for k, v in meta.items() if k not in (prefixfile.CHECKSUM, prefixfile.MAC)}
    ids = edit(ids, tensors, meta)
    meta[INDEX_CRC] = _index_crc(meta)
    prefixfile.write(dst, ids, tensors, meta, key)


def _signed(src, dst, edit) -> None:
    """_rewrite with this home's key: a file only a writer holding the secret could make (the
    checks behind the MAC: fingerprint, engine state, ids against keys)."""
    _rewrite(src, dst, edit, secret_key())


def _bad_copies(good, folder) -> int:
    """Every kind of bad file next to each other: 15 seeded single-bit flips (5 in the header,
    10 anywhere), a truncation, one from another model, one whose ids do not match its keys."""
    data = good.read_bytes()
    header = 8 + int.from_bytes(data[:8], "little")
    rng = np.random.default_rng(34)
    offsets = [int(x) for x in rng.integers(0, header, 5)] + [int(x) for x in rng.integers(0, len(data), 10)]
    for i, off in enumerate(offsets):
        flipped = bytearray(data)
        flipped[off] ^= 1 << int(rng.integers(0, 8))
        (folder / f"flip{i:02d}{SUFFIX}").write_bytes(bytes(flipped))
    (folder / f"truncated{SUFFIX}").write_bytes(data[:len(data) // 2])

    def other_model(ids, tensors, meta):
        meta["fingerprint"] = "0" * 64
        return ids

    def other_ids(ids, tensors, meta):  # another token in the input, the same keys
        ids[-1] = ids[0] if ids[-1] != ids[0] else ids[1]
        return ids
    _signed(good, folder / f"other-model{SUFFIX}", other_model)
    _signed(good, folder / f"other-ids{SUFFIX}", other_ids)
    good.unlink()
    return len(offsets) + 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bad_file_is_a_miss_with_one_warning_and_goes(bundle_int4, backend, home, capfd):
    with _open(bundle_int4, backend) as rt:
        _write_three(rt)
    folder = _folder(rt)
    (good,) = _files(folder)
    n_bad = _bad_copies(good, folder)
    capfd.readouterr()
    with _open(bundle_int4, backend) as rt:
        P = rt.manifest.tasks["support"].prefix_tokens
        got, ref = _asked_twice(rt)
        _same(got, ref)
        assert got.stats.cached_tokens == P  # a miss
        info = rt.engine_info()["prompt_cache"]
        assert info["disk_refused"] == n_bad and info["disk_loads"] == 0
    assert _files(folder) == []
    warnings = [line for line in capfd.readouterr().err.splitlines() if "prompt cache" in line]
    assert len(warnings) == n_bad and all(line.startswith("warning: prompt cache: ") for line in warnings)
    assert len({w.split(":")[2] for w in warnings}) == n_bad  # one per file, each naming its file


def test_a_file_from_another_llama_cpp_is_refused(bundle_int4, home, capfd):
    """A well-formed file whose KV state was written by another llama.cpp state format."""
    with _open(bundle_int4, "gguf") as rt:
        _write_three(rt)
    (good,) = _files(_folder(rt))

    def other_version(ids, tensors, meta):
        meta["state_version"] = "pe-seqstate-0/magic=0/session=0/seq=0/llama-cpp-python=0"
        return ids
    _signed(good, good, other_version)
    with _open(bundle_int4, "gguf") as rt:
        got = rt.generate("support", _text(DOC, QUESTIONS[3]), max_tokens=8)
        ref = rt.generate("support", _text(DOC, QUESTIONS[3]), max_tokens=8, use_prompt_cache=False)
        assert got.tokens == ref.tokens and got.stats.cached_tokens == ref.stats.cached_tokens
        assert rt.engine_info()["prompt_cache"]["disk_refused"] == 1
    assert _files(_folder(rt)) == [] and "KV state written by" in capfd.readouterr().err


# -- a writer who is not this home ----------------------------------------------------------

def _forge(mine, theirs, dst, key: bytes | None) -> None:
    """What another local user who can write the folder makes: the file indexed for one
    prompt (`mine`: its ids and keys) holding another prompt's KV (`theirs`, of the same
    length), its CRC-32s recomputed so nothing looks damaged; signed with `key` (None: not)."""
    other, _ = prefixfile.read(theirs, verify=True)

    def their_kv(ids, tensors, meta):
        for name in tensors:
            tensors[name] = other[name].copy()
        return ids
    _rewrite(mine, dst, their_kv, key)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forged_file_is_refused_and_the_answer_is_the_uncached_one(bundle_int4, backend, home, capfd):
    """Issue 50's trial: another prompt's KV under this prompt's name with recomputed CRC-32s
    was accepted and changed the answer. Now: unsigned, or signed with another home's key, it
    is refused before use (one warning naming the MAC), the answer is the uncached one, and the
    file goes. Signed with this home's key the same file IS used (the MAC is what refuses it):
    its answer differs from the uncached one, which is what the MAC keeps out."""
    with _open(bundle_int4, backend) as rt:
        n = len(rt.tokenizer.encode(DOC).ids)
        city = next(c for c in ("Paris", "Rome", "Oslo", "Lyon", "Nice")
                    if len(rt.tokenizer.encode(DOC.replace("Porto", c)).ids) == n)
        _write_three(rt, DOC.replace("Porto", city))
    folder = _folder(rt)
    (theirs,) = _files(folder)
    shutil.move(theirs, folder.parent / "theirs")
    with _open(bundle_int4, backend) as rt:
        _write_three(rt)
    (good,) = _files(folder)
    shutil.move(good, folder.parent / "mine")
    for key, refused in ((None, True), (bytes(range(32)), True), ("home", False)):
        _forge(folder.parent / "mine", folder.parent / "theirs", good, secret_key() if key == "home" else key)
        capfd.readouterr()
        with _open(bundle_int4, backend) as rt:
            P = rt.manifest.tasks["support"].prefix_tokens
            got, ref = _asked_twice(rt)
            info = rt.engine_info()["prompt_cache"]
        err = capfd.readouterr().err
        if refused:
            _same(got, ref)
            assert got.stats.cached_tokens == P and info["disk_refused"] == 1 and info["disk_loads"] == 0
            assert ("carries no MAC" if key is None else "its MAC does not match") in err
            assert not good.exists()
        else:  # the control: with the secret, the forgery is read and the answer moves
            assert info["disk_loads"] == 1 and got.stats.cached_tokens > P
            assert got.logprobs != ref.logprobs


@pytest.mark.parametrize("kind", ["fifo", "symlink", "sparse"])
def test_an_indexed_file_swapped_for_another_kind_is_refused_unread(bundle_int4, home, capfd, kind):
    """The reader does not trust the path it indexed: after a runtime has read the folder's
    headers, the file is replaced by a FIFO (opened without blocking: refused at once, the
    request answers), a symbolic link to a good copy (not followed), or a 1.5 GB sparse file
    whose header is valid for that size (refused from its size before a byte of it is read: the
    process's peak RSS does not move by it). Each time: the uncached answer, one warning."""
    import os
    import resource

    with _open(bundle_int4, "gguf") as rt:
        _write_three(rt)
    folder = _folder(rt)
    (good,) = _files(folder)
    kept = folder.parent / "kept"
    shutil.copy(good, kept)
    with _open(bundle_int4, "gguf") as rt:
        assert rt.engine_info()["prompt_cache"]["disk_files"] == 1  # indexed from its header
        good.unlink()
        if kind == "fifo":
            os.mkfifo(good)
        elif kind == "symlink":
            good.symlink_to(kept)
        else:
            import json
            data = kept.read_bytes()
            n = int.from_bytes(data[:8], "little")
            header = json.loads(data[8:8 + n])
            big = 1_500_000_000
            header = {"__metadata__": header["__metadata__"],
                      "prefix_ids": {"dtype": "I64", "shape": [0], "data_offsets": [0, 0]},
                      "state": {"dtype": "U8", "shape": [big], "data_offsets": [0, big]}}
            raw = json.dumps(header).encode()
            with open(good, "wb") as f:
                f.write(len(raw).to_bytes(8, "little") + raw)
                f.truncate(8 + len(raw) + big)  # sparse: no block written
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        capfd.readouterr()
        results = []
        t = threading.Thread(target=lambda: results.append(
            rt.generate("support", _text(DOC, QUESTIONS[3]), max_tokens=8)))
        t.start()
        t.join(120)  # a blocking open of the FIFO would never return
        assert not t.is_alive(), "the request hangs on the swapped file"
        ref = rt.generate("support", _text(DOC, QUESTIONS[3]), max_tokens=8, use_prompt_cache=False)
        (got,) = results
        assert got.tokens == ref.tokens and got.stats.cached_tokens == rt.manifest.tasks["support"].prefix_tokens
        assert rt.engine_info()["prompt_cache"]["disk_refused"] == 1
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200_000  # KiB: not 1.5 GB
    err = capfd.readouterr().err
    why = {"fifo": "not a regular file", "symlink": "a symbolic link", "sparse": "its header's positions can take"}
    assert why[kind] in err, err
    assert not os.path.lexists(good)


# -- bounds --------------------------------------------------------------------------------

def test_the_disk_budget_holds_least_recently_used_first(bundle_int4, home):
    with _open(bundle_int4, "onnx") as rt:
        _write_three(rt, OTHER[0])
        size = _files(_folder(rt))[0].stat().st_size
    budget = int(2.5 * size)
    with _open(bundle_int4, "onnx", prompt_cache_disk_bytes=budget) as rt:
        folder = _folder(rt)
        _write_three(rt, OTHER[1])  # files: 0, 1
        rt.generate("support", _text(OTHER[0], QUESTIONS[3]), max_tokens=1)  # 0 used again
        _write_three(rt, OTHER[2])  # files: 0, 2 (1 was the least recently used)
        info = rt.engine_info()["prompt_cache"]
        assert info["disk_files"] == 2 and info["disk_bytes"] <= budget and info["disk_evicted"] == 1
        assert sum(p.stat().st_size for p in _files(folder)) <= budget
    with _open(bundle_int4, "onnx", prompt_cache_disk_bytes=budget) as rt:  # read from disk: 0 and 2
        for doc, on_disk in ((OTHER[0], True), (OTHER[1], False), (OTHER[2], True)):
            r = rt.generate("support", _text(doc, QUESTIONS[3]), max_tokens=1)
            assert (r.stats.cached_tokens > rt.manifest.tasks["support"].prefix_tokens) == on_disk, doc
        assert rt.engine_info()["prompt_cache"]["disk_loads"] == 2
    with _open(bundle_int4, "onnx", prompt_cache_disk_bytes=size + 1):  # a smaller budget: trimmed at open
        assert len(_files(folder)) == 1


def test_off_by_default_and_checked(bundle_int4, home):
    with Runtime.open(bundle_int4, backend="onnx", prefill_chunk=CHUNK) as rt:
        for q in QUESTIONS:
            rt.generate("support", _text(DOC, q), max_tokens=1)
        assert "disk_files" not in rt.engine_info()["prompt_cache"]
        assert not (home / "prompt-cache").exists()
        assert "disk" not in Metrics().render(rt.engine_info())
    from prefix_edge.errors import PrefixEdgeError

    for kw in ({"prompt_cache_disk_bytes": -1}, {"prompt_cache_disk_hits": 0},
               {"prompt_cache_disk_tokens": True}):
        with pytest.raises(PrefixEdgeError, match=next(iter(kw))):
            Runtime.open(bundle_int4, backend="onnx", **kw)


def test_a_stale_temporary_file_goes_and_a_foreign_one_stays(bundle_int4, home):
    """A write cut short by a dead process leaves a temporary file: removed at the next open. A
    well-formed file for another prefill chunk is another runtime's: kept, never read here."""
    with _open(bundle_int4, "onnx") as rt:
        _write_three(rt)
    folder = _folder(rt)
    (good,) = _files(folder)
    stale = folder / f".x{SUFFIX}.tmp-999999999-1"
    shutil.copy(good, stale)

    def other_chunk(ids, tensors, meta):
        meta["prefill_chunk"] = "32"
        return ids
    _signed(good, good, other_chunk)
    with _open(bundle_int4, "onnx") as rt:
        r = rt.generate("support", _text(DOC, QUESTIONS[3]), max_tokens=1)
        assert r.stats.cached_tokens == rt.manifest.tasks["support"].prefix_tokens
        info = rt.engine_info()["prompt_cache"]
        assert info["disk_refused"] == 0 and info["disk_files"] == 1
    assert not stale.exists() and _files(folder) == [good]


def test_a_write_that_fails_is_one_warning_and_answers_stay(bundle_int4, home, capfd):
    """The folder gone (a file in its place) after open: writes fail, one warning; every answer
    is still the uncached one."""
    with _open(bundle_int4, "gguf") as rt:
        folder = _folder(rt)
        shutil.rmtree(folder)
        folder.write_bytes(b"not a folder")
        for doc in OTHER:
            _write_three(rt, doc)
            got = rt.generate("support", _text(doc, QUESTIONS[3]), max_tokens=6)
            ref = rt.generate("support", _text(doc, QUESTIONS[3]), max_tokens=6, use_prompt_cache=False)
            assert got.tokens == ref.tokens
        assert rt.engine_info()["prompt_cache"]["disk_writes"] == 0
    warnings = [line for line in capfd.readouterr().err.splitlines() if "prompt cache" in line]
    assert len(warnings) == 1 and "cannot write" in warnings[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_write_and_a_new_runtime_reads(bundle_int4, backend, home):
    """Three threads, a document each, written while the others run; a new runtime's three
    threads read them back: every answer equals the uncached one."""
    asks = {(d, q): None for d in OTHER for q in QUESTIONS}
    with Runtime.open(bundle_int4, backend=backend, prefill_chunk=CHUNK, prompt_cache_bytes=0) as rt:
        for d, q in asks:
            asks[d, q] = rt.generate("support", _text(d, q), max_tokens=6).tokens

    def run(rt, questions, got, errors):
        def one(d):
            try:
                for q in questions:
                    got[d, q] = rt.generate("support", _text(d, q), max_tokens=6)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=one, args=(d,)) for d in OTHER]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors

    got: dict = {}
    with _open(bundle_int4, backend, slots=3) as rt:
        run(rt, QUESTIONS[:3], got, [])
        rt.prompts.files.flush()
        for d in OTHER:  # a write the full queue dropped (3 at once, 2 wait) is asked at a later hit
            rt.generate("support", _text(d, "Is it in stock?"), max_tokens=1)
        rt.prompts.files.flush()
        assert rt.engine_info()["prompt_cache"]["disk_writes"] == 3
    with _open(bundle_int4, backend, slots=3) as rt:
        run(rt, QUESTIONS[3:], got, [])
        assert rt.engine_info()["prompt_cache"]["disk_loads"] == 3
        P = rt.manifest.tasks["support"].prefix_tokens
    for (d, q), ref in asks.items():
        assert got[d, q].tokens == ref, (d, q)
    assert all(got[d, QUESTIONS[3]].stats.cached_tokens > P for d in OTHER)



def test_a_restarted_server_starts_warm(bundle_int4, home):
    """`prefix-edge serve` (its disk tier on by default): a system prompt of 256+ tokens; its
    answer to a question first (the reference, a miss), then three more questions (written);
    after a restart the same question reports the system prompt in cached_tokens, with the
    same answer and log-probabilities; /metrics counts the load."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    system = "Answer from these documents.\n\n" + "\n\n".join([DOC, *OTHER])

    def ask(base, q):
        r = httpx.post(base + "/v1/chat/completions", timeout=120, json={
            "model": "base", "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]})
        assert r.status_code == 200, r.text
        return r.json()

    args = ("--backend", "gguf", "--slots", "2")
    proc, base = start_server(bundle_int4, *args)
    try:
        ref = ask(base, QUESTIONS[3])
        for q in QUESTIONS[:3]:
            ask(base, q)
    finally:
        rc, err = stop_server(proc)  # a clean stop finishes the write
    assert rc == 0 and "Traceback" not in err, err[-3000:]
    assert ref["usage"]["prompt_tokens"] > 256 + 20 and ref["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    proc, base = start_server(bundle_int4, *args)
    try:
        got = ask(base, QUESTIONS[3])
        m = metrics(base)
    finally:
        stop_server(proc)
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] > 256
    assert got["choices"][0]["message"] == ref["choices"][0]["message"]
    assert got["choices"][0]["logprobs"] == ref["choices"][0]["logprobs"]
    assert m["prefix_edge_prompt_cache_disk_loads_total"] == 1 and m["prefix_edge_prompt_cache_disk_files"] == 1
