"""The arm64 tier (`-m arm64`): the runtime on arm64, the edge's CPU, under qemu-user-static.

A Debian arm64 root (tests/helpers/arm64_root.py: mmdebstrap, cached under
~/.cache/prefix-edge/arm64/), the runtime-only install from this repo's wheel and the portable
llama-cpp-python wheel cross-built by `PREFIX_EDGE_LLAMA_TARGET=aarch64 scripts/llama-wheel.sh`,
and the default bundle exported on this x86 host (the `default_home` fixture). On both backends
the README's examples give the x86 host's tokens for the same bundle, and a baked-vs-prefilled
check and a conversation turn give them too or part from them only at a near-tie step
(tests/helpers/arm64_answers.py, run on both sides); the README's command runs as written and
`doctor` reads the arm64 CPU. Skipped, with the reason, only where the host cannot run an arm64
root (not root, no apt-get, binfmt_misc not mountable). Each phase's seconds and both hosts'
answers go to ~/.cache/prefix-edge/arm64/last-run.json.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from .helpers import arm64_root as a64

pytestmark = [pytest.mark.arm64, pytest.mark.skipif(os.environ.get("PREFIX_EDGE_ARM64") != "1", reason="the arm64 tier runs on request: PREFIX_EDGE_ARM64=1 python -m pytest -m arm64 (about 25 min: a Debian arm64 root under qemu and a cross-built llama.cpp)")]

REPO = Path(__file__).resolve().parent.parent
ANSWERS = Path(__file__).resolve().parent / "helpers" / "arm64_answers.py"
HOME_IN_ROOT = "/tmp/prefix-edge-home"
BACKENDS = ("onnx", "gguf")
README_ORDER = "Hi, this is Maria Lopez, please send 3 desk lamps to Porto."


class Arm64:
    def __init__(self, root: Path, x86_home: Path, times: dict[str, float]):
        self.root, self.x86_home, self.times = root, x86_home, times
        self.results: dict = {}

    def run(self, cmd: list[str], what: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        return _timed(self.times, f"arm64: {what}",
                      lambda: a64.in_root(self.root, cmd, timeout, what, PREFIX_EDGE_HOME=HOME_IN_ROOT))

    def x86(self, cmd: list[str], what: str) -> subprocess.CompletedProcess:
        p = _timed(self.times, f"x86: {what}", lambda: subprocess.run(
            cmd, capture_output=True, text=True, timeout=1800,
            env={**os.environ, "PREFIX_EDGE_HOME": str(self.x86_home)}))
        assert p.returncode == 0, f"{what} (x86): exit {p.returncode}\n{p.stderr[-3000:]}"
        return p

    def save(self) -> None:
        a64.CACHE.mkdir(parents=True, exist_ok=True)
        out = {"seconds": {k: round(v, 1) for k, v in self.times.items()}, **self.results}
        (a64.CACHE / "last-run.json").write_text(json.dumps(out, indent=1))


def _cpu() -> float:
    """CPU seconds of this process's waited-for children (what a phase costs on an idle host)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(times: dict, name: str, fn):
    t, c = time.perf_counter(), _cpu()
    r = fn()
    times[name] = time.perf_counter() - t
    times[f"{name} [cpu]"] = _cpu() - c
    return r


def _cross_wheel() -> Path:
    p = subprocess.run(["bash", str(REPO / "scripts" / "llama-wheel.sh"), "--build"], capture_output=True,
                       text=True, timeout=3600, env={**os.environ, "PREFIX_EDGE_LLAMA_TARGET": "aarch64",
                                                    "PYTHON": sys.executable})
    assert p.returncode == 0, f"the aarch64 cross build failed:\n{p.stderr[-3000:]}"
    wheel = Path(p.stdout.strip().splitlines()[-1])
    assert wheel.name.endswith("-linux_aarch64.whl"), wheel
    return wheel


def _repo_wheel(out: Path) -> Path:
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        str(REPO), "-w", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return next(out.glob("prefix_edge-*.whl"))


def _runtime_deps() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [d.split("#")[0].strip() for d in project["dependencies"]] + list(a64.LLAMA_DEPS)


@pytest.fixture(scope="module")
def arm64(request, tmp_path_factory):
    times: dict[str, float] = {}
    try:
        _timed(times, "host: tools and binfmt", a64.host_ready)
    except a64.Unavailable as e:
        pytest.skip(f"arm64 tier: {e}")
    default_home = request.getfixturevalue("default_home")  # exported only where the tier can run
    llama = _timed(times, "host: aarch64 llama wheel (cross build, cached)", _cross_wheel)
    wheel = _timed(times, "host: prefix-edge wheel", lambda: _repo_wheel(tmp_path_factory.mktemp("arm64-wheel")))
    with a64.locked(a64.CACHE / ".lock"):
        root = _timed(times, "root (build or cache)", lambda: a64.cached_root(_runtime_deps(), times))
        _timed(times, "root: install the two wheels", lambda: a64.install_wheels(root, [wheel, llama]))
        home = root / HOME_IN_ROOT.lstrip("/")
        a64.place_tree(default_home / "bundles", home / "bundles")
        shutil.copy(ANSWERS, root / "tmp" / ANSWERS.name)
        env = Arm64(root, default_home, times)
        try:
            yield env
        finally:
            env.save()
            shutil.rmtree(home, ignore_errors=True)


def test_doctor_reads_the_arm64_cpu(arm64):
    """No /proc or /sys in the root: the doctor says what it could not read, takes the CPU's
    features from the kernel's AT_HWCAP instead, and llama.cpp runs with NEON."""
    rep = json.loads(arm64.run(["prefix-edge", "doctor", "--json"], "doctor --json").stdout)
    arm64.results["doctor"] = rep
    assert rep["platform"] == "Linux aarch64", rep["platform"]
    assert "asimd" in rep["cpu_features"] and rep["cpu_features_source"] == "AT_HWCAP", rep
    unread = " ".join(rep["unreadable"])
    assert "/proc/cpuinfo" in unread and "/sys/devices/system/cpu" in unread, rep["unreadable"]
    assert rep["backends"]["onnx"]["ok"] and rep["backends"]["gguf"]["ok"], rep["backends"]
    assert "NEON = 1" in rep["backends"]["gguf"]["build"], rep["backends"]["gguf"]["build"]
    text = arm64.run(["prefix-edge", "doctor"], "doctor").stdout
    assert "could not read /proc/cpuinfo" in text and "(from AT_HWCAP)" in text, text


def test_readme_example_as_written(arm64):
    """The README's first command, as written (`--backend auto`: gguf, llama.cpp runs here), on
    arm64 prints the x86 host's output byte for byte."""
    cmd = ["prefix-edge", "run", "--task", "order_json", README_ORDER]
    x86 = arm64.x86([str(Path(sys.executable).parent / cmd[0]), *cmd[1:]], "readme").stdout
    arm = arm64.run(cmd, "readme").stdout
    arm64.results["readme"] = {"x86": x86, "arm64": arm}
    assert arm == x86 and json.loads(arm)["city"] == "Porto", (arm, x86)


# Where the two CPUs' kernels round differently a greedy answer may take another of nearly tied
# tokens, and past that step the texts go their own ways. Measured (2026-12-03, default bundle):
# ONNX int4 (ORT's MatMulNBits kernels differ by CPU) chose tokens whose log-probabilities differ
# by up to 0.51 nats between the two CPUs, and parted at steps where the reference's token led by
# 0.05-0.31 nats; llama.cpp Q4_1 differs by up to 0.06 nats and parted once, at a 0.10 lead. A
# divergence where the reference's token led the other's by more than this (a restored prefix
# gone wrong: a confident step, a lead of several nats) fails.
NEAR_TIE = 1.0  # nats


def divergence(other: dict, ref: dict) -> dict | None:
    """None when the tokens are equal. Else the first differing step, the reference's
    log-probability lead there of its token over the other's (inf: not in its top-5), and, over
    the steps before it, the largest difference between the two runs' log-probabilities of the
    tokens they chose (the kernels' numeric noise)."""
    a, b = other["tokens"], ref["tokens"]
    if a == b:
        return None
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    noise = max((abs(dict(map(tuple, other["top"][k]))[a[k]] - dict(map(tuple, ref["top"][k]))[b[k]])
                 for k in range(i)), default=0.0)
    if i >= min(len(a), len(b)):
        return {"step": i, "gap": float("inf"), "why": "one answer ends where the other goes on"}
    top = dict(map(tuple, ref["top"][i]))
    gap = top[b[i]] - top[a[i]] if a[i] in top else float("inf")
    return {"step": i, "of": len(b), "gap": round(gap, 4), "noise_before": round(noise, 4)}


def turns_divergence(other: list[dict], ref: list[dict]) -> dict:
    """Turn by turn, up to the first turn that parts (the next one's history differs)."""
    out = {}
    for k, (a, b) in enumerate(zip(other, ref)):
        out[f"turn {k + 1}"] = d = divergence(a, b)
        if d is not None:
            break
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_answers_equal_x86(arm64, backend):
    """The README's examples give the x86 host's tokens on arm64 (NEON kernels, prefixes baked on
    x86). A task baked vs prefilled and two conversation turns give them too, or part from them
    only at a near-tie step (NEAR_TIE): how far, and how near, is recorded. One thread on both
    sides (the same kernels' split; and no OpenMP spinning on a busy 2-core host)."""
    x86 = json.loads(arm64.x86([sys.executable, str(ANSWERS), backend, "1"], f"answers {backend}").stdout)
    arm = json.loads(arm64.run(["python", f"/tmp/{ANSWERS.name}", backend, "1"], f"answers {backend}").stdout)
    n = arm["prefix_task"]["prefix_tokens"]
    assert arm["baked"]["cached_tokens"] == n and arm["prefilled"]["cached_tokens"] == 0, arm
    assert arm["turns"][1]["cached_tokens"] > arm["turns"][0]["cached_tokens"], arm["turns"]
    for key in ("order_json", "sentiment_tuned"):
        assert arm[key]["tokens"] == x86[key]["tokens"], (key, arm[key], x86[key])
    assert arm["sentiment_tuned"]["text"].strip() == "negative", arm["sentiment_tuned"]
    assert x86["baked"]["tokens"] == x86["prefilled"]["tokens"], (x86["baked"], x86["prefilled"])
    parted = {"arm64 baked vs arm64 prefilled": divergence(arm["baked"], arm["prefilled"]),
              **{f"arm64 vs x86: {k}": divergence(arm[k], x86[k]) for k in ("baked", "prefilled")},
              **{f"arm64 vs x86: {k}": d for k, d in turns_divergence(arm["turns"], x86["turns"]).items()}}
    arm64.results.setdefault("answers", {})[backend] = {"x86": x86, "arm64": arm, "parted": parted}
    far = {k: d for k, d in parted.items() if d is not None and not d["gap"] < NEAR_TIE}
    assert not far, (far, parted)
