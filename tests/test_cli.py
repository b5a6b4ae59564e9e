"""The `prefix-edge` command in a subprocess: JSON schema, listing, and one-line errors."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from .conftest import INPUTS, cli, run_json
from .helpers.errors import assert_one_line_error


def test_json_schema(bundle_fp32):
    out = run_json("--bundle", bundle_fp32, "--task", "sentiment", INPUTS[0])
    assert set(out) == {"text", "tokens", "stats"}
    assert isinstance(out["text"], str) and all(isinstance(t, int) for t in out["tokens"])
    for k in ("prefix_tokens", "input_tokens", "prefix_load_ms", "ttft_ms", "decode_tok_s", "total_ms"):
        assert isinstance(out["stats"][k], (int, float)), k
    assert out["stats"]["prefix_tokens"] > 0 and out["stats"]["input_tokens"] > 0
    from prefix_edge.runtime.engines.cpus import default_threads

    from prefix_edge import Runtime

    with Runtime.open(bundle_fp32) as rt:  # backend "auto", the CLI's default: the backend it picks
        ref = rt.generate("sentiment", INPUTS[0])
        auto = rt.backend.name
    assert out["stats"]["threads"] == default_threads() and out["stats"]["backend"] == auto
    assert out["tokens"] == ref.tokens and out["text"] == ref.text


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_no_prefix_cache_matches_and_stdin(bundle_int4, backend):
    a = run_json("--bundle", bundle_int4, "--backend", backend, "--task", "support", stdin=INPUTS[1].encode())
    b = run_json("--bundle", bundle_int4, "--backend", backend, "--task", "support", "--no-prefix-cache", INPUTS[1])
    assert a["tokens"] == b["tokens"] and a["text"] == b["text"]
    assert b["stats"]["prefix_load_ms"] == 0


def test_streaming_output_is_the_text(bundle_fp32):
    ref = run_json("--bundle", bundle_fp32, "--task", "extract", INPUTS[0])
    p = cli("run", "--bundle", bundle_fp32, "--task", "extract", INPUTS[0])
    assert p.returncode == 0 and p.stdout.decode() == ref["text"] + "\n"


def test_tasks_and_inspect(bundle_fp32):
    p = cli("tasks", "--bundle", bundle_fp32)
    assert p.returncode == 0
    for t in ("support", "sentiment", "extract", "raw"):
        assert t in p.stdout.decode()
    p = cli("inspect", "--bundle", bundle_fp32, "--json")
    info = json.loads(p.stdout)
    assert info["model"]["n_kv_heads"] == 2 and info["model"]["n_heads"] == 4
    assert info["backends"]["onnx"]["quantization"] == "none"
    assert info["tasks"]["support"]["prefix_tokens"] > 100


def test_unknown_task(bundle_fp32):
    assert_one_line_error(cli("run", "--bundle", bundle_fp32, "--task", "nope", "x"), "unknown task 'nope'")


def test_missing_bundle(tmp_path):
    assert_one_line_error(cli("run", "--bundle", tmp_path / "nowhere", "--task", "a", "x"), "no bundle")
    p = cli("run", "--task", "support", "x", env={"PREFIX_EDGE_HOME": str(tmp_path)})
    assert_one_line_error(p, "prefix-edge export")


def test_input_longer_than_context(bundle_fp32):
    assert_one_line_error(cli("run", "--bundle", bundle_fp32, "--task", "support", "zq " * 600), "context")


def test_non_utf8_stdin(bundle_fp32):
    assert_one_line_error(cli("run", "--bundle", bundle_fp32, "--task", "support", stdin=b"caf\xe9\xff"),
                          "not valid UTF-8")


def test_bad_task_file_leaves_nothing(tiny_model, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[task.a]\nsystem = "s"\nmax_tokens = "many"\n')
    out = tmp_path / "bundle"
    assert_one_line_error(cli("export", tiny_model, "--tasks", bad, "--out", out), str(bad), "task 'a'", "max_tokens")
    assert not out.exists()


def test_failed_export_is_atomic(tiny_model, tmp_path):
    """A failure after files were written (a prefix longer than the context, found once the
    tokenizer is saved) leaves no bundle and no partial directory behind."""
    long = tmp_path / "long.toml"
    long.write_text('[task.a]\nchat = false\nprefix = """' + "zq " * 700 + '"""\n')
    out = tmp_path / "bundle"
    assert_one_line_error(cli("export", tiny_model, "--tasks", long, "--out", out, "--quantize", "none"), "context")
    assert list(tmp_path.iterdir()) == [long]


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_refuses_prefix_from_another_bundle(bundle_fp32, bundle_int4, tmp_path, backend):
    b = shutil.copytree(bundle_fp32, tmp_path / "b")
    f = f"tasks/support.{backend}.safetensors"
    shutil.copy(bundle_int4 / f, b / f)
    assert_one_line_error(cli("run", "--bundle", b, "--backend", backend, "--task", "support", "x"),
                          "does not match its manifest entry")
    # and with the manifest entry edited to match the copied file: its fingerprint gives it away
    from prefix_edge.bundle import sha256_file

    m = json.loads((b / "manifest.json").read_text())
    m["tasks"]["support"]["prefixes"][backend].update(sha256=sha256_file(b / f), bytes=(b / f).stat().st_size)
    (b / "manifest.json").write_text(json.dumps(m))
    assert_one_line_error(cli("run", "--bundle", b, "--backend", backend, "--task", "support", "x"),
                          "different model")
    # other tasks of the bundle still run
    assert cli("run", "--bundle", b, "--backend", backend, "--task", "sentiment", "x").returncode == 0


@pytest.mark.parametrize("edit", ["n_kv_heads", "rope", "model_sha", "gguf_state"])
def test_refuses_edited_manifest(bundle_fp32, tmp_path, edit):
    b = shutil.copytree(bundle_fp32, tmp_path / "b")
    m = json.loads((b / "manifest.json").read_text())
    if edit == "n_kv_heads":
        m["model"]["n_kv_heads"] = 4
    elif edit == "rope":
        m["model"]["rope"]["theta"] = 500000.0
    elif edit == "model_sha":
        m["backends"]["onnx"]["files"]["onnx/model.onnx"] = "0" * 64
    else:
        m["backends"]["gguf"]["state"]["v_trans"] = False
    (b / "manifest.json").write_text(json.dumps(m))
    backend = "gguf" if edit == "gguf_state" else "onnx"
    assert_one_line_error(cli("run", "--bundle", b, "--backend", backend, "--task", "support", "x"), "re-export")


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_refuses_changed_model_file(bundle_fp32, tmp_path, backend):
    b = shutil.copytree(bundle_fp32, tmp_path / "b")
    # a first run verifies the files and remembers their hashes (runtime/verify.py) ...
    assert cli("run", "--bundle", b, "--backend", backend, "--task", "support", "x").returncode == 0
    # ... a later change to the file is still caught
    rel = f"{backend}/model.{backend}"
    data = bytearray((b / rel).read_bytes())
    data[len(data) - 100] ^= 0x01  # a weight byte near the end of the file
    (b / rel).write_bytes(bytes(data))
    assert_one_line_error(cli("run", "--bundle", b, "--backend", backend, "--task", "support", "x"), rel, "changed")


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_runtime_never_imports_torch(bundle_int4, backend):
    code = (
        "import sys, prefix_edge\n"
        f"rt = prefix_edge.Runtime.open({str(bundle_int4)!r}, backend={backend!r})\n"
        "r = rt.generate('support', 'hello', max_tokens=4)\n"
        "list(rt.stream('raw', 'hello', max_tokens=4))\n"
        "from prefix_edge.cli import main\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'optimum', 'peft'})\n"
        "assert not heavy, heavy\n"
        "print('ok')\n")
    import subprocess

    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_verify_command(bundle_int4, tmp_path):
    p = cli("verify", bundle_int4, "--json")
    assert p.returncode == 0, p.stderr.decode()
    rep = json.loads(p.stdout)
    m = json.loads((bundle_int4 / "manifest.json").read_text())  # every file the manifest lists, once
    listed = [m["tokenizer"]["file"]] + [f for b in m["backends"].values() for f in b["files"]] + \
        [e["file"] for t in m["tasks"].values() for e in t["prefixes"].values()]
    assert len(listed) == 1 + 2 + 4 * 2  # tokenizer, the two models, 4 tasks x 2 backends
    assert rep["ok"] and sorted(r["file"] for r in rep["files"]) == sorted(listed)
    assert all(r["status"] == "ok" for r in rep["files"])
    b = shutil.copytree(bundle_int4, tmp_path / "b")
    f = b / "tasks" / "raw.gguf.safetensors"
    data = bytearray(f.read_bytes())
    data[-10] ^= 0xFF
    f.write_bytes(bytes(data))
    p = cli("verify", b, "--json")
    rep = json.loads(p.stdout)
    assert p.returncode == 1 and not rep["ok"]
    assert [r["file"] for r in rep["files"] if r["status"] != "ok"] == ["tasks/raw.gguf.safetensors"]


def test_unknown_cli_option_is_one_line(bundle_int4):
    p = cli("run", "--bundle", bundle_int4, "--task", "raw", "--no-such-option", "x")
    err = p.stderr.decode()
    assert p.returncode == 2 and "Traceback" not in err and "no-such-option" in err
    assert len([ln for ln in err.splitlines() if ln.strip()]) <= 3, err


def test_kill_9_export_never_leaves_a_half_bundle(tiny_model, tasks_file, tmp_path):
    """kill -9 an export replacing a bundle at 10 seeded points: the path always opens as a
    complete bundle (old or new), and the next export leaves no temp dir behind."""
    import os
    import random
    import signal
    import subprocess
    import time

    from prefix_edge import Runtime
    from prefix_edge.bundle import Manifest

    out = tmp_path / "bundle"
    args = [sys.executable, "-m", "prefix_edge", "export", str(tiny_model), "--tasks", str(tasks_file),
            "--out", str(out), "--quantize", "none", "--gguf-quant", "f32", "--force"]
    t0 = time.time()
    assert subprocess.run(args, capture_output=True).returncode == 0
    full = time.time() - t0
    rng = random.Random(9)
    created = {Manifest.read(out).extra["created"]}
    for k in range(10):
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, full * 1.1))
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        m = Manifest.read(out)  # a complete bundle, old or new
        created.add(m.extra["created"])
        for backend in ("onnx", "gguf"):
            with Runtime.open(out, backend=backend) as rt:
                ban = {e: -100 for e in rt.manifest.model.eos_token_ids}  # exactly max_tokens
                assert rt.generate("raw", "x", max_tokens=2, logit_bias=ban).stats.generated_tokens == 2
    assert subprocess.run(args, capture_output=True).returncode == 0
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".bundle.")]
    assert left == [], left
    created.add(Manifest.read(out).extra["created"])
    assert len(created) >= 2  # the bundle was replaced (by a killed export's swap or the last one)


@pytest.mark.parametrize("config,tokenizer", [("{bad", "{}"), ('{"model_type": "llama"}', "{}"),
                                              ('{"model_type": "llama"}', "not json")])
def test_export_of_a_broken_model_dir_is_one_line(tasks_file, tmp_path, config, tokenizer):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(config)
    (d / "tokenizer.json").write_text(tokenizer)
    p = cli("export", d, "--tasks", tasks_file, "--out", tmp_path / "out")
    assert_one_line_error(p, "cannot load the model")
    assert not (tmp_path / "out").exists()
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith(".out.")] == []


@pytest.mark.parametrize("size", ["300k", "900k"])
def test_full_disk_at_export_is_named(tiny_model, tasks_file, tmp_path, size):
    """An export onto a full disk (a small tmpfs; root only) is one line naming the full disk,
    at whichever stage it runs out, not "cannot load the model"."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        p = cli("export", tiny_model, "--tasks", tasks_file, "--out", mnt / "b", "--quantize", "none")
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    err = p.stderr.decode().strip().splitlines()
    assert p.returncode == 1 and err[-1].startswith("error: No space left on device"), err[-3:]
    assert not any("Traceback" in line for line in err)


def test_help_text_survives_the_renderer():
    """Every command's --help shows each option's help as written: no markup eaten (rich once
    printed "(the  extra)" for "(the [ray] extra)") and no value placeholder on a flag."""
    import re

    import click
    import typer
    from click.testing import CliRunner

    from prefix_edge.cli import _register, app

    _register()
    root = typer.main.get_command(app)
    runner = CliRunner()
    for name, cmd in root.commands.items():
        out = runner.invoke(root, [name, "--help"], terminal_width=400).output
        flat = " ".join(out.split())
        for p in cmd.params:
            if not isinstance(p, click.Option) or not p.help:
                continue
            for bracket in re.findall(r"\[[^\]]*\]", p.help):
                assert bracket in flat, (name, p.name, bracket)
            if p.is_flag:
                line = next(ln for ln in out.splitlines() if p.opts[0] in ln)
                assert "<bool>" not in line, (name, line)
