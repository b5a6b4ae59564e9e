"""The desktop example (examples/desktop/app.py) in a real Tk window on Xvfb: two tasks answered
exactly as the runtime answers them, a Stop during the prefill, and a screenshot."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from prefix_edge import Runtime

from .conftest import INPUTS

APP = Path(__file__).resolve().parent.parent / "examples" / "desktop" / "app.py"


@pytest.fixture(scope="module")
def display():
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        pytest.skip("Xvfb is not installed (apt-get install xvfb; .ci/run installs it)")
    for n in range(90, 110):
        if not Path(f"/tmp/.X11-unix/X{n}").exists() and not Path(f"/tmp/.X{n}-lock").exists():
            break
    proc = subprocess.Popen([xvfb, f":{n}", "-screen", "0", "1024x768x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if Path(f"/tmp/.X11-unix/X{n}").exists():
            break
        time.sleep(0.05)
    old = os.environ.get("DISPLAY")
    os.environ["DISPLAY"] = f":{n}"
    yield f":{n}"
    if old is None:
        os.environ.pop("DISPLAY", None)
    else:
        os.environ["DISPLAY"] = old
    proc.terminate()
    proc.wait(10)


def _load_app():
    spec = importlib.util.spec_from_file_location("desktop_app", APP)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _pump(app, until, timeout=60.0):
    end = time.time() + timeout
    while time.time() < end:
        app.root.update()
        if until():
            return
        time.sleep(0.01)
    raise AssertionError("the window did not get there in time")


def test_desktop_app_two_tasks_stop_and_screenshot(display, bundle_int4, tmp_path):
    import tkinter as tk

    mod = _load_app()
    with Runtime.open(bundle_int4, backend="onnx", prefill_chunk=1) as rt:
        root = tk.Tk()
        try:
            app = mod.App(root, rt)
            _pump(app, lambda: True)
            assert set(app.picker["values"]) == set(rt.tasks)
            for task, text in (("support", INPUTS[0]), ("sentiment", INPUTS[1])):
                ref = rt.generate(task, text)
                app.task.set(task)
                app.input.delete("1.0", "end")
                app.input.insert("1.0", text)
                app.run_button.invoke()
                _pump(app, lambda: str(app.run_button["state"]) == "normal")
                assert app.output_text() == ref.text
                assert app.last_result.tokens == ref.tokens
                assert app.status.get().startswith(ref.stats.finish_reason)
            # Stop during the prefill (one token per step here), from the UI thread
            app.task.set("raw")
            app.input.delete("1.0", "end")
            app.input.insert("1.0", " ".join(INPUTS * 3))
            app.run_button.invoke()
            app.stop_button.invoke()
            _pump(app, lambda: str(app.run_button["state"]) == "normal")
            assert app.status.get().startswith("cancelled"), app.status.get()
            assert app.last_result.stats.finish_reason == "cancelled"
            # a screenshot of the real window
            from PIL import ImageGrab

            root.update()
            shot = ImageGrab.grab(xdisplay=display)
            path = tmp_path / "desktop.png"
            shot.save(path)
            assert path.stat().st_size > 1000 and shot.size == (1024, 768)
            lo, hi = shot.convert("L").getextrema()
            assert lo < hi  # something was drawn
        finally:
            root.destroy()
