"""A peer benchmark (benchmarks/*.py --stdin) as a process of its own, loaded once and run
once per call, so `bench` can interleave the peer's runs with the runtime's."""

from __future__ import annotations

import json
import subprocess
import tempfile

from ..errors import PrefixEdgeError


class PeerLoop:
    """A peer benchmark process (benchmarks/*.py --stdin): loaded once, one run per line sent."""

    def __init__(self, cmd: list[str]):
        self.err = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True)
        self.info = self._line()
        self.info.pop("ready", None)

    def _line(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            self.err.seek(0)
            err = (self.err.read().strip().splitlines() or ["?"])[-1]
            self.close()
            raise PrefixEdgeError(f"the peer exited: {err}")
        return json.loads(line)

    def run(self) -> float:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return float(self._line()["tok_s"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.err.close()
