"""Tasks created at run time (runtime/tasks.py, bundle/created.py) on a Runtime over the fake
engine (tests/helpers/fake_bundle.py): made, served as the bundle's own, kept across a reopen,
deleted; every bad field refused in one line naming it; budgets; a damaged or foreign store
refused task by task; a writer killed at any point leaves each task whole or absent.

The fake's logits are a function of every token before, so a created task's answer equals the
prefill of its prefix exactly when its baked state holds that prefix: each reference here is
the same call with use_prefix_cache=False (the prefix prefilled in the request)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from prefix_edge import Runtime
from prefix_edge.bundle import Bundle
from prefix_edge.bundle.created import TaskExists, TaskStoreFull
from prefix_edge.errors import PrefixEdgeError
from prefix_edge.runtime.tasks import ExportedTask, UnknownTask
from tests.helpers.fake_bundle import write_bundle
from tests.helpers.fake_engine import SLOT, FakeEngine

ROOT = Path(__file__).resolve().parents[1]
ASK = [{"role": "user", "content": "w9 w10 w11"}]


@pytest.fixture()
def root(tmp_path):
    return write_bundle(tmp_path / "bundle", {"greet": "w5 w6 w7"}, {"helper": "w20 w21"})


def opened(root, **kw) -> Runtime:
    return Runtime.open(root, backend=SLOT, engine=FakeEngine, **kw)


def answers(rt, task, **kw) -> tuple:
    baked = rt.generate(task, messages=ASK, max_tokens=10, logprobs=2, **kw)
    prefilled = rt.generate(task, messages=ASK, max_tokens=10, logprobs=2, use_prefix_cache=False, **kw)
    return baked, prefilled


def test_a_created_task_is_served_as_an_exported_one_and_outlives_its_runtime(root):
    with opened(root) as rt:
        made = rt.add_task("pirate", system="w30 w31 w32", examples=[{"user": "w1", "assistant": "w2 w3"}],
                           max_tokens=7, temperature=0.0)
        assert made["origin"] == "created" and made["verified"] == {"probe_tokens": 8, "baked_equals_prefilled": True}
        assert made["prefix_tokens"] == rt.tasks["pirate"].prefix_tokens > 10
        assert made["fields"]["system"] == "w30 w31 w32" and made["defaults"] == {"max_tokens": 7, "temperature": 0.0}
        baked, prefilled = answers(rt, "pirate")
        assert baked.tokens == prefilled.tokens and baked.logprobs == prefilled.logprobs
        assert baked.stats.cached_from["task_prefix"] == made["prefix_tokens"]
        assert len(rt.generate("pirate", messages=ASK).tokens) <= 7  # its own default
        assert rt.engine_info()["created_tasks"]["count"] == 1
    with opened(root) as again:  # read back from the store, as the bundle's own
        assert again.task_info("pirate")["created"] == made["created"]
        assert again.generate("pirate", messages=ASK, max_tokens=10).tokens == baked.tokens
        again.remove_task("pirate")
        assert "pirate" not in again.tasks
        with pytest.raises(PrefixEdgeError, match="unknown task 'pirate'"):
            again.generate("pirate", messages=ASK)
        with pytest.raises(UnknownTask):
            again.remove_task("pirate")
    with opened(root) as third:
        assert "pirate" not in third.tasks
    assert [p.name for p in (root / "created").iterdir()] == []


def test_made_again_under_its_name_it_answers_as_its_new_prefix(root):
    """Deleted and made again with another system prompt (as many tokens): the prompt cache and
    the resident prefixes keep nothing of the old one (their keys hold the prefix's digest)."""
    long_ask = [{"role": "user", "content": " ".join(f"w{10 + i % 40}" for i in range(150))},
                {"role": "assistant", "content": "w7"}, {"role": "user", "content": "w8"}]
    with opened(root, shared_kv=True) as rt:
        rt.add_task("t", system="w30 w31")
        old = rt.generate("t", messages=long_ask, max_tokens=6)
        assert rt.generate("t", messages=long_ask, max_tokens=6).stats.cached_from["prompt_cache"] > 0
        rt.remove_task("t")
        rt.add_task("t", system="w40 w41")
        new = rt.generate("t", messages=long_ask, max_tokens=6)
        ref = rt.generate("t", messages=long_ask, max_tokens=6, use_prefix_cache=False)
        assert new.stats.cached_from["prompt_cache"] == 0 and new.tokens == ref.tokens != old.tokens


@pytest.mark.parametrize("name, fields, kind, param", [
    ("a b", {"system": "w1"}, PrefixEdgeError, "name"),
    ("x", {"system": 3}, PrefixEdgeError, "system"),
    ("x", {}, PrefixEdgeError, "prefix"),
    ("x", {"system": "w1", "prefix": "w2"}, PrefixEdgeError, "prefix"),
    ("x", {"system": "w1", "template": "no input here"}, PrefixEdgeError, "template"),
    ("x", {"system": "w1", "examples": [{"user": "w1"}]}, PrefixEdgeError, "examples"),
    ("x", {"system": "w1", "colour": "red"}, PrefixEdgeError, "colour"),
    ("x", {"system": "w1", "kind": "peft"}, PrefixEdgeError, "kind"),
    ("x", {"system": "w1", "adapter": "/tmp"}, PrefixEdgeError, "adapter"),
    ("x", {"system": "w1", "compress_prefix": 0.5}, PrefixEdgeError, "compress_prefix"),
    ("x", {"system": "w1", "temperature": -1}, PrefixEdgeError, "temperature"),
    ("x", {"system": "w1", "json_schema": {"type": "object", "properties": 3}}, PrefixEdgeError, "json_schema"),
    ("x", {"system": "w1", "logit_bias": {"999": 1.0}}, PrefixEdgeError, "logit_bias"),
    ("x", {"system": " ".join(["w3"] * 600)}, PrefixEdgeError, "system"),
    ("greet", {"system": "w1"}, ExportedTask, "name"),
    ("GREET", {"system": "w1"}, ExportedTask, "name"),
])
def test_a_bad_task_is_refused_in_one_line_naming_its_field(root, name, fields, kind, param):
    with opened(root) as rt:
        with pytest.raises(kind) as e:
            rt.add_task(name, **fields)
        assert e.value.param == param and "\n" not in str(e.value), (str(e.value), e.value.param)
        assert set(rt.tasks) == {"greet", "helper"}
    assert not (root / "created").exists() or not any((root / "created").iterdir())


def test_a_taken_name_and_the_budgets(root):
    with opened(root, task_bytes=10_000, task_store_bytes=600) as rt:
        rt.add_task("one", prefix="w1 w2 w3")
        with pytest.raises(TaskExists) as e:
            rt.add_task("one", prefix="w4")
        assert e.value.param == "name"
        with pytest.raises(TaskStoreFull, match="delete a task first"):  # 2 files of ~400 bytes > 600
            rt.add_task("two", prefix="w4 w5 w6")
        assert sorted(rt.tasks) == ["greet", "helper", "one"]
    with opened(root, task_bytes=100) as rt:
        with pytest.raises(PrefixEdgeError, match="over this runtime's 100 a task") as e:
            rt.add_task("big", prefix="w1 w2")
        assert e.value.param == "prefix"
    assert sorted(p.name for p in (root / "created").iterdir()) == ["one"]


def _corrupt(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x20
    path.write_bytes(bytes(data))


def test_a_damaged_or_foreign_task_is_left_out_in_one_line(root, tmp_path, capfd):
    with opened(root) as rt:
        for name in ("ok", "entry", "prefix", "foreign"):
            rt.add_task(name, system=f"w3{len(name)} w1")
    store = root / "created"
    edited = json.loads((store / "entry" / "task.json").read_text())  # edited, its checksum not
    edited["task"]["defaults"] = {"max_tokens": 1}
    (store / "entry" / "task.json").write_text(json.dumps(edited))
    prefix = next((store / "prefix").glob("*.safetensors"))
    _corrupt(prefix, prefix.stat().st_size - 3)
    doc = json.loads((store / "foreign" / "task.json").read_text())  # consistent, for another model
    from prefix_edge.bundle.created import _digest

    doc["model"] = "0" * 64
    doc["sha256"] = _digest(doc)
    (store / "foreign" / "task.json").write_text(json.dumps(doc))
    (store / "half").mkdir()  # a folder without an entry is no task
    capfd.readouterr()
    with opened(root) as rt:
        assert sorted(rt.tasks) == ["greet", "helper", "ok"]
        assert rt.generate("ok", messages=ASK, max_tokens=4).tokens
    err = capfd.readouterr().err
    for name, why in (("entry", "checksum"), ("prefix", "does not match its entry"), ("foreign", "another model")):
        line = next(x for x in err.splitlines() if f"'{name}'" in x)
        assert why in line and line.endswith("left out"), line
    rows = Bundle.open(root).verify_all()
    assert sum(r["status"] == "FAIL" and r["kind"] == "created task" for r in rows) == 3


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from prefix_edge import Runtime
    from tests.helpers.fake_engine import SLOT, FakeEngine

    root, start = Path(sys.argv[1]), int(sys.argv[2])
    with Runtime.open(root, backend=SLOT, engine=FakeEngine, read_ahead=False) as rt:
        print("ready", flush=True)
        for i in range(start, start + 10_000):
            system = " ".join(f"w{1 + (i * 7 + j) % 60}" for j in range(200))
            rt.add_task(f"t{i}", system=system)
            if i % 2:
                rt.remove_task(f"t{i - 1}")
""")


def test_a_writer_killed_at_any_point_leaves_each_task_whole_or_absent(root):
    """A process creating and deleting tasks as fast as it can, killed with SIGKILL at seeded
    random moments, 12 times: after each, every task the store holds reads back whole (its entry
    and files checked) and is served, and no half task is one."""
    rng = random.Random(52)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = 0
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(start)], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(rng.uniform(0.02, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        start += 10_000
        b = Bundle.open(root)
        names = b.store.names()
        assert sorted(b.created) == names  # every entry on disk is a whole task
        with opened(root) as rt:
            for name in names[-3:]:
                baked, prefilled = answers(rt, name)
                assert baked.tokens == prefilled.tokens
    leftovers = [p.name for p in (root / "created").iterdir() if p.name.startswith(".")]
    # what a killed writer leaves is hidden (swept once an hour old: created.STALE_S), never a task
    assert all(n.startswith((".new-", ".gone-", ".bake-", ".task.json", ".tmp")) for n in leftovers), leftovers


def test_runtimes_sharing_a_store_follow_each_other(root):
    """Two runtimes on one store (two processes, two replicas): a task made by one is served by
    the other at its first call of it, made again there with another prompt it answers as the
    new one, and deleted there it is gone here too."""
    with opened(root) as a, opened(root) as b:
        assert "t" not in b.tasks
        a.add_task("t", system="w30 w31")
        first = b.generate("t", messages=ASK, max_tokens=6)  # b had never heard of it
        assert first.tokens == a.generate("t", messages=ASK, max_tokens=6).tokens
        a.remove_task("t")
        with pytest.raises(PrefixEdgeError, match="unknown task 't'"):
            b.generate("t", messages=ASK, max_tokens=6)
        a.add_task("t", system="w40 w41")
        again = b.generate("t", messages=ASK, max_tokens=6)
        assert again.tokens == a.generate("t", messages=ASK, max_tokens=6, use_prefix_cache=False).tokens
        assert again.tokens != first.tokens
        assert b.task_info("t")["fields"] == {"system": "w40 w41"}


def test_a_re_export_keeps_the_tasks_its_model_can_serve(root, tmp_path):
    """export --force of the same model carries the store's tasks into the new bundle (they read
    back whole there); a bundle of another model takes none of them."""
    import shutil

    from prefix_edge.bundle.manifest import Manifest
    from prefix_edge.export.build import carry_created

    with opened(root) as rt:
        rt.add_task("kept", system="w30 w31")
    same = Manifest.read(root)
    new = tmp_path / "new"
    shutil.copytree(root, new, ignore=shutil.ignore_patterns("created"))
    assert carry_created(root, new, same) == ["kept"]
    with opened(new) as rt:
        baked, prefilled = answers(rt, "kept")
        assert rt.task_info("kept")["origin"] == "created" and baked.tokens == prefilled.tokens
    other = Manifest.read(root)
    other.model.vocab_size += 1  # another model
    (tmp_path / "other").mkdir()
    assert carry_created(root, tmp_path / "other", other) == []
    assert not (tmp_path / "other" / "created").exists()


@pytest.mark.parametrize("name", ["../bundle", "..", "a/b", "x\x00y", "", "café"])
def test_a_name_no_task_can_have_is_never_a_path(root, name):
    """A name that is a path (or holds a NUL) is no task's: looked up, deleted or made, it is
    refused in one line and nothing outside the store is touched."""
    (root / "created").mkdir(exist_ok=True)
    with opened(root) as rt:
        assert not rt.has_task(name)
        with pytest.raises(PrefixEdgeError):
            rt.task_info(name)
        with pytest.raises(PrefixEdgeError):
            rt.remove_task(name)
        with pytest.raises(PrefixEdgeError) as e:
            rt.add_task(name, system="w1")
        assert e.value.param == "name"
    with pytest.raises(PrefixEdgeError):
        Bundle.open(root).store.remove(name)
    assert (root / "manifest.json").is_file() and sorted(p.name for p in root.iterdir()) == \
        ["created", "manifest.json", "onnx", "prefixes", "tokenizer"]
