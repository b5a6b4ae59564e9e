"""`prefix-edge doctor`: what this machine has and which backends run on it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import platform
import sys
from pathlib import Path
from typing import Optional

import typer

from .app import app
from ..runtime.engines.cpus import cpu_features, read_cpu_features

def _ort_cache() -> dict | None:
    """This machine's cache of ORT's optimized models (runtime/engines/onnx/ort_cache.py), None without ORT."""
    try:
        from ..runtime.engines.onnx import ort_cache

        return ort_cache.summary()
    except (ImportError, OSError):
        return None


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _probe_model(bundle: Optional[Path]) -> Optional[Path]:
    """A GGUF file to probe llama.cpp with: the bundle's, the default bundle's, or the embedded one."""
    from ..bundle import Bundle
    from ..errors import PrefixEdgeError

    for root in ([bundle] if bundle else []) + [None]:
        try:
            model = Bundle.open(root).model_file("gguf")
        except PrefixEdgeError:  # no such bundle, or one without a GGUF model: try the next
            continue
        if model.is_file():
            return model
    try:
        from ..export.source import default_model_path

        return default_model_path()
    except Exception:
        return None


def _onnx_status() -> tuple[bool, str, list[str]]:
    if importlib.util.find_spec("onnxruntime") is None:
        return False, "onnxruntime is not installed", []
    try:
        import onnxruntime as ort

        return True, f"onnxruntime {ort.__version__}", list(ort.get_available_providers())
    except Exception as e:  # a broken install
        return False, f"onnxruntime does not import: {str(e).splitlines()[0]}", []


def _cpu_share() -> dict:
    """What threads="auto" would run now: the CPUs others keep busy, read over half a second."""
    import os
    import time

    from ..runtime.engines.cpu_share import INTERVAL, cpu_share

    share = cpu_share()
    share.describe()  # the first reading; the second, an interval later, measures
    time.sleep(INTERVAL + 0.05)
    out = share.describe()
    try:
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        out["load_average"] = None
    return out


@app.command()
def doctor(
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="Probe llama.cpp with this bundle's GGUF model."),
    refresh: bool = typer.Option(False, "--refresh", help="Probe llama.cpp again instead of using the cached verdict."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Versions, CPU features, devices, and which backends run here (llama.cpp is probed in a
    child process, so a build that crashes on this CPU is reported, not fatal)."""
    from .. import __version__
    from ..runtime.engines.cpus import budget
    from ..llamacpp.probe import llama_verdict

    onnx_ok, onnx_detail, providers = _onnx_status()
    cpu = read_cpu_features()
    model = _probe_model(bundle)
    v = llama_verdict(model, refresh=refresh)
    if v is None:
        gguf_ok, gguf_detail = False, "llama-cpp-python is not installed (pip install 'prefix-edge[llama]')"
    else:
        gguf_ok, gguf_detail = v.ok, v.detail
    report = {
        "prefix_edge": __version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu_features": cpu_features(cpu),
        "cpu_features_source": cpu.source,
        "unreadable": list(cpu.unread),
        "threads": vars(budget()),
        "cpu_share": _cpu_share(),
        "packages": {d: _version(d) for d in ("numpy", "onnxruntime", "onnxruntime-gpu", "tokenizers",
                                               "llama-cpp-python", "torch", "transformers")},
        "backends": {
            "onnx": {"ok": onnx_ok, "detail": onnx_detail,
                     "devices": ["cpu"] + (["cuda"] if "CUDAExecutionProvider" in providers else []),
                     "providers": providers, "session_cache": _ort_cache()},
            "gguf": {"ok": gguf_ok, "detail": gguf_detail,
                     "probe_model": str(model) if model else None,
                     "build": v.system_info if v else "", "library_sha256": v.library_sha256 if v else ""},
        },
    }
    if as_json:
        typer.echo(json.dumps(report, indent=1))
    else:
        typer.echo(f"prefix-edge {report['prefix_edge']}  python {report['python']}  {report['platform']}")
        src = f" (from {cpu.source})" if cpu.source and cpu.source != "/proc/cpuinfo" else ""
        typer.echo("cpu features: " + (" ".join(report["cpu_features"]) or "unknown") + src)
        for what in cpu.unread:
            typer.echo(f"     could not read {what}")
        typer.echo("engine threads by default: " + budget().describe())
        share = report["cpu_share"]
        typer.echo(f"     threads auto now: {share['threads_now']} (other processes keep "
                   f"{share['others_busy_cpus']:g} of {share['allowed_cpus']} CPUs busy, from {share['source']}; "
                   f"load average {share['load_average']})")
        typer.echo("packages: " + "  ".join(f"{k} {v_}" for k, v_ in report["packages"].items()
                                             if v_ != "not installed"))
        for name, b in report["backends"].items():
            mark = "ok  " if b["ok"] else "FAIL"
            extra = f"  devices: {', '.join(b['devices'])}" if name == "onnx" and b["ok"] else ""
            typer.echo(f"{mark} {name}: {b['detail']}{extra}")
        c = report["backends"]["onnx"]["session_cache"]
        if c:
            typer.echo(f"     onnx session cache: {c['entries']} model(s), {c['bytes'] / 1e6:.0f} MB in {c['dir']}"
                       + ("" if c["enabled"] else " (off: PREFIX_EDGE_ORT_CACHE=0)"))
        if v is not None and v.system_info:
            typer.echo(f"     llama.cpp build: {v.system_info}")
    if not (onnx_ok or gguf_ok):
        raise typer.Exit(1)
