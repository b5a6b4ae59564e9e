"""How many threads an engine should use here: the physical cores this process may run on.

Both engines are memory-bound at decode and gain nothing from SMT siblings; more threads than
cores only make them wait on each other (measured on a 2-core VM: llama.cpp's own default of 4
threads decoded 46 tok/s, 2 threads 74 tok/s). The count respects

- the CPU affinity mask (taskset, cpusets, a container's --cpuset-cpus),
- a cgroup CPU quota (docker --cpus, Kubernetes limits; cgroup v2 cpu.max or v1 cfs_quota),
- SMT: logical CPUs that share a core (same package and core id in sysfs) count once,
- on macOS, the performance cores (hw.perflevel0.physicalcpu), else hw.physicalcpu.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")
CGROUP = Path("/sys/fs/cgroup")


# CPU features that decide which llama.cpp / ORT kernels can run.
_X86 = ("sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512_vnni", "avx512_bf16",
        "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
_ARM = ("asimd", "asimddp", "i8mm", "sve", "sve2", "bf16")


_ARM_HWCAP = {"asimd": 1, "asimddp": 20, "sve": 22}  # AT_HWCAP bits (linux/arch/arm64 uapi hwcap.h)
_ARM_HWCAP2 = {"sve2": 1, "i8mm": 13, "bf16": 14}    # AT_HWCAP2 bits


@dataclass(frozen=True)
class CpuFeatures:
    flags: frozenset[str]     # every flag the OS reports (empty: unknown)
    source: str               # "/proc/cpuinfo", "AT_HWCAP", "sysctl", or "" (unknown)
    unread: tuple[str, ...]   # what could not be read here, each "PATH: why"


def _is_arm(machine: str) -> bool:
    return machine.lower().startswith(("aarch64", "arm"))


def _from_cpuinfo(text: str, machine: str) -> frozenset[str] | None:
    """The `flags` line (x86) or the `Features` line (arm64) of /proc/cpuinfo; None without it."""
    keys = ("features",) if _is_arm(machine) else ("flags",) if machine.lower() in ("x86_64", "amd64", "i686") \
        else ("flags", "features")
    for line in text.splitlines():
        if line.split(":")[0].strip().lower() in keys and ":" in line:
            return frozenset(line.split(":", 1)[1].split())
    return None


def _from_hwcap() -> frozenset[str] | None:
    """Linux arm64 without /proc: the kernel's AT_HWCAP / AT_HWCAP2 bits (getauxval)."""
    import ctypes

    try:
        getauxval = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError):
        return None
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    hwcap, hwcap2 = getauxval(16), getauxval(26)
    if not hwcap:
        return None
    return frozenset([f for f, bit in _ARM_HWCAP.items() if hwcap >> bit & 1]
                     + [f for f, bit in _ARM_HWCAP2.items() if hwcap2 >> bit & 1])


def read_cpu_features(cpuinfo: Path = Path("/proc/cpuinfo"), sys_cpu: Path = SYS_CPU,
                      machine: str | None = None) -> CpuFeatures:
    """This CPU's feature flags (Linux /proc/cpuinfo: `flags` on x86, `Features` on arm64, else
    AT_HWCAP on arm64; macOS sysctl hw.optional.*) and what could not be read on the way."""
    machine = machine or platform.machine()
    unread: list[str] = []
    flags: frozenset[str] | None = None
    source = ""
    try:
        flags = _from_cpuinfo(cpuinfo.read_text(), machine)
        if flags is None:
            line = "Features" if _is_arm(machine) else "flags"
            unread.append(f"{cpuinfo}: no `{line}` line for this {machine} CPU")
        else:
            source = str(cpuinfo)
    except OSError as e:
        if platform.system() != "Darwin":
            unread.append(f"{cpuinfo}: {e.strerror or e} (is /proc mounted?)")
    if platform.system() == "Linux" and not sys_cpu.is_dir():
        unread.append(f"{sys_cpu}: not there (is /sys mounted?); core topology unknown, "
                      "and ONNX Runtime's cpuinfo warns about it")
    if flags is None and platform.system() == "Linux" and _is_arm(machine):
        flags = _from_hwcap()
        source = "AT_HWCAP" if flags is not None else ""
    if flags is None and platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-a"], capture_output=True, text=True, timeout=10).stdout
            flags = frozenset(ln.split(":")[0].rsplit(".", 1)[-1].lower() for ln in out.splitlines()
                              if ln.startswith("hw.optional.") and ln.rstrip().endswith(": 1"))
            source = "sysctl"
        except (OSError, subprocess.SubprocessError) as e:
            unread.append(f"sysctl -a: {e}")
    return CpuFeatures(flags or frozenset(), source, tuple(unread))


def cpu_flags() -> frozenset[str]:
    """Every feature flag the OS reports for this CPU; empty when unknown."""
    return read_cpu_features().flags


def cpu_features(report: CpuFeatures | None = None) -> list[str]:
    """The flags that decide which llama.cpp / ORT kernels run (all of them on macOS)."""
    report = report or read_cpu_features()
    if report.source == "sysctl":
        return sorted(report.flags)
    return [f for f in (*_X86, *_ARM) if f in report.flags]


@dataclass(frozen=True)
class CpuBudget:
    threads: int          # what the engines use by default
    logical: int          # logical CPUs this process may run on
    physical: int | None  # distinct cores among them (None: topology unknown)
    quota: float | None   # cgroup CPU quota in CPUs (None: no limit)

    def describe(self) -> str:
        parts = [f"{self.logical} logical CPUs"]
        if self.physical is not None:
            parts.append(f"{self.physical} physical cores")
        if self.quota is not None:
            parts.append(f"cgroup quota {self.quota:g} CPUs")
        return f"{self.threads} threads ({', '.join(parts)})"


def _allowed_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _physical(cpus: list[int], root: Path = SYS_CPU) -> int | None:
    cores = set()
    for c in cpus:
        topo = root / f"cpu{c}" / "topology"
        try:
            cores.add((topo.joinpath("physical_package_id").read_text().strip(),
                       topo.joinpath("core_id").read_text().strip()))
        except OSError:
            return None
    return len(cores) or None


def _quota(root: Path = CGROUP) -> float | None:
    """The CPU quota of this process's cgroup (v2 `cpu.max`, v1 `cpu.cfs_quota_us`), if any."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def _mac_cores() -> int | None:
    for key in ("hw.perflevel0.physicalcpu", "hw.physicalcpu"):
        try:
            out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5)
            if out.returncode == 0 and out.stdout.strip().isdigit():
                return int(out.stdout)
        except (OSError, subprocess.SubprocessError):
            pass
    return None


def budget(sys_cpu: Path = SYS_CPU, cgroup: Path = CGROUP, cpus: list[int] | None = None) -> CpuBudget:
    cpus = _allowed_cpus() if cpus is None else cpus
    if platform.system() == "Darwin":
        physical = _mac_cores()
    else:
        physical = _physical(cpus, sys_cpu)
    quota = _quota(cgroup) if platform.system() == "Linux" else None
    n = physical or len(cpus)
    if quota is not None:
        n = min(n, max(1, math.ceil(quota - 1e-9)))
    return CpuBudget(threads=max(1, n), logical=len(cpus), physical=physical, quota=quota)


_CACHED: CpuBudget | None = None


def default_threads() -> int:
    """The engines' thread count when none is given (computed once per process)."""
    global _CACHED
    if _CACHED is None:
        _CACHED = budget()
    return _CACHED.threads
