"""Default engine threads: physical cores, affinity and cgroup quota (real sysfs-shaped files),
and no engine burns CPU while a runtime idles."""

from __future__ import annotations

import resource
import time

import pytest

from prefix_edge.runtime.engines.cpus import budget, cpu_features, read_cpu_features

from .conftest import INPUTS


def _sysfs(root, cores):  # cores: for each logical cpu, (package, core)
    for cpu, (pkg, core) in enumerate(cores):
        d = root / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{pkg}\n")
        (d / "core_id").write_text(f"{core}\n")
    return root


def test_smt_siblings_count_once(tmp_path):
    sysfs = _sysfs(tmp_path / "sys", [(0, 0), (0, 1), (0, 0), (0, 1), (1, 0), (1, 1), (1, 0), (1, 1)])
    b = budget(sysfs, tmp_path / "nocgroup", cpus=list(range(8)))
    assert (b.threads, b.logical, b.physical, b.quota) == (4, 8, 4, None)
    # an affinity mask holding both siblings of one core and one of another: 2 cores
    assert budget(sysfs, tmp_path / "nocgroup", cpus=[0, 2, 1]).threads == 2


@pytest.mark.parametrize("cpu_max, want", [("max 100000\n", 4), ("150000 100000\n", 2),
                                           ("50000 100000\n", 1), ("800000 100000\n", 4)])
def test_cgroup_v2_quota(tmp_path, cpu_max, want):
    sysfs = _sysfs(tmp_path / "sys", [(0, c) for c in range(4)])
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "cpu.max").write_text(cpu_max)
    assert budget(sysfs, cg, cpus=list(range(4))).threads == want


def test_cgroup_v1_quota_and_unknown_topology(tmp_path):
    cg = tmp_path / "cg"
    (cg / "cpu").mkdir(parents=True)
    (cg / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (cg / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    b = budget(tmp_path / "no-sysfs", cg, cpus=list(range(6)))  # no topology: logical CPUs count
    assert (b.physical, b.quota, b.threads) == (None, 3.0, 3)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm asimddp
CPU implementer\t: 0x41
"""


def test_arm64_features_come_from_the_features_line(tmp_path):
    (tmp_path / "cpuinfo").write_text(ARM_CPUINFO)
    (tmp_path / "cpu").mkdir()
    rep = read_cpu_features(tmp_path / "cpuinfo", tmp_path / "cpu", machine="aarch64")
    assert (rep.source, rep.unread) == (str(tmp_path / "cpuinfo"), ())
    assert cpu_features(rep) == ["asimd", "asimddp"]
    # an x86 `flags` line (qemu-user shows the host's /proc/cpuinfo) is not this arm64 CPU's
    (tmp_path / "x86").write_text("processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma\n")
    rep = read_cpu_features(tmp_path / "x86", tmp_path / "cpu", machine="aarch64")
    assert "no `Features` line" in rep.unread[0] and not {"avx2", "fma"} & rep.flags, rep


def test_what_could_not_be_read_is_named(tmp_path):
    """No /proc, no /sys (a chroot): both named; x86 has no other source, so no features."""
    rep = read_cpu_features(tmp_path / "proc" / "cpuinfo", tmp_path / "sys" / "cpu", machine="x86_64")
    assert rep.flags == frozenset() and rep.source == ""
    assert [u.split(":")[0] for u in rep.unread] == [str(tmp_path / "proc" / "cpuinfo"),
                                                     str(tmp_path / "sys" / "cpu")], rep.unread
    assert "is /proc mounted?" in rep.unread[0] and "is /sys mounted?" in rep.unread[1]


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_idle_runtime_burns_no_cpu(bundle_int4, backend):
    """After a request, an idle runtime (a desktop app waiting for input) uses no CPU: neither
    the scheduler thread nor an engine's thread pool spins."""
    from prefix_edge import Runtime

    with Runtime.open(bundle_int4, backend=backend, threads=2) as rt:
        assert rt.threads == 2
        rt.generate("support", INPUTS[1], max_tokens=16)
        time.sleep(0.5)  # let a pool's spin-before-sleep run out
        c = _cpu_s()
        time.sleep(1.0)
        assert _cpu_s() - c < 0.1
