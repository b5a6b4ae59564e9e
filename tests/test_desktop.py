"""The desktop example (examples/desktop/app.py) in a real Tk window on Xvfb: a conversation and
a one-shot task answered exactly as the runtime answers them, New chat, a Stop during the
prefill, and a screenshot."""

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
            ref_conv = rt.chat("support")

            def send(text):
                app.input.delete("1.0", "end")
                app.input.insert("1.0", text)
                app.run_button.invoke()
                _pump(app, lambda: str(app.run_button["state"]) == "normal")

            app.task.set("support")
            app.new_chat()
            for k, text in enumerate(INPUTS[:2]):  # a conversation: turn 2 sees turn 1
                ref = ref_conv.send(text)
                send(text)
                assert app.reply == ref.text and app.last_result.tokens == ref.tokens
                assert app.status.get().startswith(ref.stats.finish_reason)
                assert f"You: {text}" in app.output_text()
                if k:
                    assert app.last_result.stats.cached_tokens > rt.tasks["support"].prefix_tokens
            assert app.conv.messages == ref_conv.messages
            app.new_button.invoke()  # New chat: the history goes
            assert app.output_text() == "" and app.conv.messages == []
            send(INPUTS[0])
            assert app.last_result.tokens == rt.generate("support", INPUTS[0]).tokens
            app.task.set("raw")  # not a chat task: one message at a time
            app.new_chat()
            for text in INPUTS[1:3]:
                send(text)
                assert app.last_result.tokens == rt.generate("raw", text).tokens
                assert app.output_text().count("You:") == 1
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
