"""The arm64 tier's host side (tests/test_arm64.py): a Debian arm64 root run under
qemu-user-static through binfmt_misc, made once with mmdebstrap and cached under
~/.cache/prefix-edge/arm64/ with a venv holding the runtime's dependencies (from PyPI's
manylinux aarch64 wheels); each session installs this repo's wheel and the cross-built
llama-cpp-python wheel into it and runs commands there with chroot.

Where the host cannot do this at all (not root, no apt-get for the tools, binfmt_misc not
mountable) `host_ready` raises Unavailable with the reason; anything else that fails raises."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# no libgomp1: the portable llama.cpp wheel carries its own (scripts/llama-wheel.sh carry_libgomp)
DEBS = ("python3", "python3-venv", "ca-certificates")
# host command -> the Debian package that has it
HOST_TOOLS = {"mmdebstrap": "mmdebstrap", "arch-test": "arch-test",
              "qemu-aarch64-static": "qemu-user-static", "update-binfmts": "binfmt-support"}
# llama-cpp-python's own dependencies (its wheel's Requires-Dist), installed with the root
LLAMA_DEPS = ("typing-extensions>=4.5.0", "numpy>=1.20.0", "diskcache>=5.6.1", "jinja2>=2.11.3")
BINFMT = Path("/proc/sys/fs/binfmt_misc")
VENV = "/opt/prefix-edge"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "prefix-edge" / "arm64"


class Unavailable(Exception):
    """This host cannot run an arm64 root (the tier skips with this reason)."""


def _run(cmd: list[str], timeout: float, what: str, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{what}: exit {p.returncode}\n{(p.stdout + p.stderr)[-3000:]}")
    return p


def host_ready() -> None:
    """Root, the tools (apt-get installs them when missing), binfmt_misc mounted, qemu-aarch64
    registered."""
    if os.geteuid() != 0:
        raise Unavailable("not root: chroot, binfmt_misc and apt-get need root")
    missing = sorted({deb for tool, deb in HOST_TOOLS.items() if shutil.which(tool) is None})
    if missing:
        if shutil.which("apt-get") is None:
            raise Unavailable(f"no apt-get to install {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
        if subprocess.run(install, capture_output=True, env=env, timeout=900).returncode != 0:
            _run(["apt-get", "update", "-q"], 900, "apt-get update")
            _run(install, 900, f"apt-get install {' '.join(missing)}", env=env)
    if not (BINFMT / "register").exists():
        p = subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0 or not (BINFMT / "register").exists():
            raise Unavailable(f"binfmt_misc is not mountable here: {(p.stderr or p.stdout).strip()}")
    if not (BINFMT / "qemu-aarch64").exists():
        _run(["update-binfmts", "--enable", "qemu-aarch64"], 60, "update-binfmts --enable qemu-aarch64")
    if "enabled" not in (BINFMT / "qemu-aarch64").read_text():
        raise RuntimeError(f"{BINFMT / 'qemu-aarch64'} is registered but not enabled")


@contextmanager
def locked(path: Path):
    """One session at a time builds or uses the cached root (another waits)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")  # the host's CAs (a TLS proxy's among them)
ROOT_CA = "/etc/ssl/certs/host-ca-certificates.crt"
PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")


def clean_env(**extra: str) -> dict[str, str]:
    """Inside the root: none of the host's variables (pip's find-links, constraints, venv) but
    its proxy, if any."""
    return {"PATH": f"{VENV}/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", **{k: os.environ[k] for k in PROXY_VARS if k in os.environ},
            **extra}


def in_root(root: Path, cmd: list[str], timeout: float, what: str, **env: str) -> subprocess.CompletedProcess:
    """Run cmd inside the root (chroot; the arm64 binaries through qemu-user-static)."""
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"  # looked up on the host's PATH
    return _run([chroot, str(root), *cmd], timeout, f"{what} (arm64 root)", env=clean_env(**env))


def root_key(deps: list[str]) -> str:
    return hashlib.sha256(json.dumps([SUITE, MIRROR, DEBS, VENV, sorted(deps)]).encode()).hexdigest()[:12]


def cached_root(deps: list[str], times: dict[str, float]) -> Path:
    """The arm64 root with a venv holding `deps`, built once per key (Debian's suite and
    packages, the pip requirements); older roots are removed. Call under `locked`."""
    final = CACHE / f"debian-{SUITE}-arm64-{root_key(deps)}"
    if (final / ".complete").is_file():
        times["root (cached)"] = 0.0
        return final
    t = time.perf_counter()
    tmp = CACHE / f".build-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    _run(["mmdebstrap", "--arch=arm64", "--variant=minbase", f"--include={','.join(DEBS)}", "--quiet",
          SUITE, str(tmp), MIRROR], 1800, "mmdebstrap --arch=arm64")
    times["root: mmdebstrap"] = time.perf_counter() - t
    t = time.perf_counter()
    in_root(tmp, ["python3", "-m", "venv", VENV], 900, "python3 -m venv")
    pip_deps(tmp, deps)
    times["root: pip install dependencies"] = time.perf_counter() - t
    (tmp / ".complete").write_text(json.dumps({"deps": sorted(deps)}))
    for old in CACHE.glob(f"debian-{SUITE}-arm64-*"):
        shutil.rmtree(old, ignore_errors=True)
    tmp.rename(final)
    return final


def pip_deps(root: Path, deps: list[str]) -> None:
    """The runtime's dependencies from PyPI (manylinux aarch64 wheels), through the host's DNS
    and CAs (the root's own CA list lacks a TLS proxy's)."""
    shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
    cert = []
    if HOST_CA.is_file():
        shutil.copy(HOST_CA, root / ROOT_CA.lstrip("/"))
        cert = ["--cert", ROOT_CA]
    in_root(root, [f"{VENV}/bin/pip", "install", "--quiet", "--disable-pip-version-check", *cert,
                   "--only-binary=:all:", *deps], 1800, "pip install the runtime's dependencies")


def install_wheels(root: Path, wheels: list[Path]) -> None:
    """This session's wheels into the root's venv, without touching its dependencies, which must
    then be complete (`pip check`)."""
    inbox = root / "tmp" / "wheels"
    shutil.rmtree(inbox, ignore_errors=True)
    inbox.mkdir(parents=True)
    for w in wheels:
        shutil.copy(w, inbox / w.name)
    in_root(root, [f"{VENV}/bin/pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                   "--force-reinstall", *[f"/tmp/wheels/{w.name}" for w in wheels]], 900, "pip install the wheels")
    in_root(root, [f"{VENV}/bin/pip", "check", "--disable-pip-version-check"], 300, "pip check")
    shutil.rmtree(inbox, ignore_errors=True)


def place_tree(src: Path, dst: Path) -> None:
    """A copy of src at dst (hard links where the filesystem allows: a bundle is read-only)."""
    shutil.rmtree(dst, ignore_errors=True)

    def link(s, d):
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)
    shutil.copytree(src, dst, copy_function=link)
