"""A small desktop app that embeds the prefix-edge runtime in-process (Tkinter).

    python examples/desktop/app.py [--bundle DIR] [--backend auto|onnx|gguf]

Pick a task, type an input, press Run: the answer streams in from a worker thread; Stop cancels
it (also during the prefill); the status line shows TTFT, tok/s and why it ended. The UI thread
never calls the runtime's blocking iterator: the worker puts chunks on a queue that the UI
drains every 20 ms (Tk is single-threaded).
"""

from __future__ import annotations

import argparse
import queue
import threading
import tkinter as tk
from tkinter import ttk

from prefix_edge import PrefixEdgeError, Runtime


class App:
    def __init__(self, root: tk.Tk, rt: Runtime):
        self.root, self.rt = root, rt
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.stream = None
        self.last_result = None
        root.title("prefix-edge")
        frame = ttk.Frame(root, padding=8)
        frame.grid(sticky="nsew")
        root.columnconfigure(0, weight=1)
        root.rowconfigure(0, weight=1)
        frame.columnconfigure(1, weight=1)
        frame.rowconfigure(3, weight=1)

        ttk.Label(frame, text="Task").grid(row=0, column=0, sticky="w")
        self.task = tk.StringVar(value=next(iter(sorted(rt.tasks)), ""))
        self.picker = ttk.Combobox(frame, textvariable=self.task, values=sorted(rt.tasks),
                                   state="readonly", width=30)
        self.picker.grid(row=0, column=1, sticky="w")
        ttk.Label(frame, text="Input").grid(row=1, column=0, sticky="nw")
        self.input = tk.Text(frame, height=4, width=70, wrap="word")
        self.input.grid(row=1, column=1, sticky="ew", pady=4)
        buttons = ttk.Frame(frame)
        buttons.grid(row=2, column=1, sticky="w")
        self.run_button = ttk.Button(buttons, text="Run", command=self.run)
        self.run_button.grid(row=0, column=0)
        self.stop_button = ttk.Button(buttons, text="Stop", command=self.stop, state="disabled")
        self.stop_button.grid(row=0, column=1, padx=6)
        self.output = tk.Text(frame, height=14, width=70, wrap="word", state="disabled")
        self.output.grid(row=3, column=0, columnspan=2, sticky="nsew", pady=4)
        self.status = tk.StringVar(value=f"{len(rt.tasks)} tasks · {rt.backend.name}")
        ttk.Label(frame, textvariable=self.status).grid(row=4, column=0, columnspan=2, sticky="w")
        root.protocol("WM_DELETE_WINDOW", self.quit)
        root.after(20, self.poll)

    # -- actions --------------------------------------------------------------------------
    def run(self) -> None:
        text = self.input.get("1.0", "end").strip()
        self.set_output("")
        try:
            self.stream = self.rt.stream(self.task.get(), text)
        except PrefixEdgeError as e:
            self.status.set(f"error: {e}")
            return
        self.run_button.configure(state="disabled")
        self.stop_button.configure(state="normal")
        self.status.set("generating ...")
        threading.Thread(target=self.worker, args=(self.stream,), daemon=True).start()

    def worker(self, stream) -> None:
        try:
            for chunk in stream:
                self.events.put(("text", chunk))
            self.events.put(("done", stream.result))
        except PrefixEdgeError as e:
            self.events.put(("error", str(e)))

    def stop(self) -> None:
        if self.stream is not None:
            self.stream.cancel()  # safe from the UI thread

    def quit(self) -> None:
        self.stop()
        self.root.destroy()

    # -- UI thread ------------------------------------------------------------------------
    def poll(self) -> None:
        while True:
            try:
                kind, value = self.events.get_nowait()
            except queue.Empty:
                break
            if kind == "text":
                self.append(value)
            else:
                self.run_button.configure(state="normal")
                self.stop_button.configure(state="disabled")
                if kind == "error":
                    self.status.set(f"error: {value}")
                else:
                    s = value.stats
                    self.last_result = value
                    self.status.set(f"{s.finish_reason} · TTFT {s.ttft_ms:.0f} ms · "
                                    f"{s.decode_tok_s:.1f} tok/s · {s.generated_tokens} tokens · "
                                    f"prefix {s.prefix_tokens} tokens")
        self.root.after(20, self.poll)

    def append(self, text: str) -> None:
        self.output.configure(state="normal")
        self.output.insert("end", text)
        self.output.see("end")
        self.output.configure(state="disabled")

    def set_output(self, text: str) -> None:
        self.output.configure(state="normal")
        self.output.delete("1.0", "end")
        self.output.insert("1.0", text)
        self.output.configure(state="disabled")

    def output_text(self) -> str:
        return self.output.get("1.0", "end-1c")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--backend", default="auto")
    a = ap.parse_args()
    try:
        rt = Runtime.open(a.bundle, backend=a.backend, slots=2)  # one answer at a time (+1 while a cancel lands)
    except PrefixEdgeError as e:
        raise SystemExit(f"error: {e}")
    root = tk.Tk()
    App(root, rt)
    try:
        root.mainloop()
    finally:
        rt.close()


if __name__ == "__main__":
    main()
