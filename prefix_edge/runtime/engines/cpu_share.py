"""How many threads a native forward should run *now*: the CPUs this process may use, less what
other processes are using of them, less what this process's other native pools hold.

An edge runtime never has the machine to itself. A thread pool of the full core count beside
another busy process loses time slices at every barrier: on a 2-core VM, llama.cpp's default (2
threads, OpenMP barriers that spin) decoded 1.8 tok/s beside a second prefix-edge process, one
thread 76 tok/s. No fixed count is right for both an idle and a busy machine, so with
threads="auto" (the default) each engine asks `CpuShare.lease` before a forward:

    others  = CPU time the allowed CPUs spent busy (user, system, irq, steal) less this
              process's own CPU time, over the last interval (>= 0.2 s), in CPUs
    free    = allowed CPUs (affinity, cgroup quota, physical cores) - others
    threads = max(1, min(wanted, round(free) - threads other forwards of this process hold))

so an idle machine gets every core, a machine where another app keeps a core busy gets the rest,
and the generator and the embedder of one server never run two full-width pools at once. The
reading is /proc/stat (Linux; elsewhere the load average stands in for `others`). Spinning waits
go with it: a contended engine runs fewer threads, so fewer of them spin at a barrier.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

INTERVAL = 0.2   # seconds between two readings of the machine's CPU time
SMOOTH = 0.5     # weight of the newest reading in the moving average of `others`
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system (idle iowait) irq softirq steal


def _read_stat(cpus: set[int], stat: Path) -> int | None:
    """Busy clock ticks summed over `cpus` (/proc/stat's per-CPU lines), None if unreadable."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    busy = 0
    seen = False
    for ln in lines:
        if not ln.startswith("cpu") or ln.startswith("cpu "):
            continue
        name, *vals = ln.split()
        try:
            if int(name[3:]) not in cpus:
                continue
            busy += sum(int(vals[i]) for i in _BUSY_FIELDS if i < len(vals))
            seen = True
        except ValueError:
            continue
    return busy if seen else None


def _self_ticks() -> int:
    """This process's CPU time (user + system, all threads) in clock ticks."""
    t = os.times()
    return int(round((t.user + t.system) * _TICK))


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class CpuShare:
    """The process's share of its CPUs, read at most every INTERVAL seconds (thread-safe)."""

    def __init__(self, allowed: int, cpus: set[int] | None = None, stat: Path = Path("/proc/stat")):
        self.allowed = max(1, int(allowed))   # what this process may use (budget(): cores, quota)
        self.cpus = set(cpus) if cpus is not None else (
            set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1)))
        self.stat = stat
        self.others = 0.0           # CPUs other processes keep busy (moving average)
        self.in_use = 0             # threads this process's running forwards hold now
        self._lock = threading.Lock()
        self._last: tuple[float, int, int] | None = None  # (time, busy ticks, own ticks)
        self.readable = _read_stat(self.cpus, stat) is not None

    def _update(self, now: float) -> None:
        """Refresh `others` (under the lock) if the last reading is INTERVAL old."""
        if self._last is not None and now - self._last[0] < INTERVAL:
            return
        if self.readable:
            busy, own = _read_stat(self.cpus, self.stat), _self_ticks()
            if busy is None:
                return
            if self._last is not None:
                dt = (now - self._last[0]) * _TICK
                seen = max(0.0, ((busy - self._last[1]) - (own - self._last[2])) / dt) if dt > 0 else 0.0
                self.others = SMOOTH * min(seen, float(len(self.cpus))) + (1 - SMOOTH) * self.others
            self._last = (now, busy, own)
        else:  # no /proc/stat (macOS): the 1-minute load average, less what this process runs
            try:
                load = os.getloadavg()[0]
            except OSError:
                load = 0.0
            self.others = max(0.0, load - self.in_use)
            self._last = (now, 0, 0)

    def choose(self, wanted: int) -> int:
        """Threads for one forward that wants `wanted`, given the machine now (no lease)."""
        with self._lock:
            self._update(time.monotonic())
            return self._choose(wanted)

    def _choose(self, wanted: int) -> int:
        free = min(float(self.allowed), self.allowed - self.others)
        return max(1, min(int(wanted), int(free + 0.5) - self.in_use))

    @contextmanager
    def lease(self, wanted: int):
        """Threads for one forward (yielded), held against this process's other forwards until
        it ends."""
        with self._lock:
            self._update(time.monotonic())
            n = self._choose(wanted)
            self.in_use += n
        try:
            yield n
        finally:
            with self._lock:
                self.in_use -= n

    def describe(self) -> dict:
        with self._lock:
            self._update(time.monotonic())
            return {"allowed_cpus": self.allowed, "others_busy_cpus": round(self.others, 2),
                    "threads_now": self._choose(self.allowed),
                    "source": "/proc/stat" if self.readable else "load average"}


BACKGROUND_NICE = 10  # how much lower a background runtime's threads run (nice, Linux/macOS)
PRIORITIES = ("normal", "background")
_LOWERED: set[int] = set()


def lower_this_thread() -> None:
    """Run the calling thread at a lower scheduling priority (once per thread): a background
    runtime's engine and embedder threads, whose forwards then yield to the app's own work. On
    Linux a thread's nice value is its own (setpriority on its thread id); elsewhere, where the
    call would lower the whole process or is not there, nothing happens."""
    import sys

    tid = threading.get_native_id()
    if tid in _LOWERED or not sys.platform.startswith("linux"):
        return
    _LOWERED.add(tid)
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE))
    except (OSError, AttributeError):
        pass


_SHARE: CpuShare | None = None
_SHARE_LOCK = threading.Lock()


def cpu_share() -> CpuShare:
    """The process-wide share (one per process: every engine leases from it)."""
    global _SHARE
    with _SHARE_LOCK:
        if _SHARE is None:
            from .cpus import default_threads

            _SHARE = CpuShare(default_threads())
        return _SHARE
