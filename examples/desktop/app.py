"""A small desktop chat app that embeds the prefix-edge runtime in-process (Tkinter).

    python examples/desktop/app.py [--bundle DIR] [--backend auto|onnx|gguf]

Pick a task, type a message, press Send: the reply streams in from a worker thread and joins
the conversation (a chat task keeps its history: each turn resumes from the turn cache, so it
prefills only the new message); New chat starts over, as does picking another task; Stop
cancels a reply (also during the prefill); the status line shows TTFT, tok/s, the tokens
reused and why it ended. A task that is not a chat task (chat = false) answers each message on
its own. The UI thread never calls the runtime's blocking iterator: the worker puts chunks on
a queue that the UI drains every 20 ms (Tk is single-threaded).
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
        self.conv = None  # the conversation of a chat task (None: one message at a time)
        self.reply = ""
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
        self.picker.bind("<<ComboboxSelected>>", lambda _e: self.new_chat())
        ttk.Label(frame, text="Input").grid(row=1, column=0, sticky="nw")
        self.input = tk.Text(frame, height=4, width=70, wrap="word")
        self.input.grid(row=1, column=1, sticky="ew", pady=4)
        buttons = ttk.Frame(frame)
        buttons.grid(row=2, column=1, sticky="w")
        self.run_button = ttk.Button(buttons, text="Send", command=self.run)
        self.run_button.grid(row=0, column=0)
        self.stop_button = ttk.Button(buttons, text="Stop", command=self.stop, state="disabled")
        self.stop_button.grid(row=0, column=1, padx=6)
        self.new_button = ttk.Button(buttons, text="New chat", command=self.new_chat)
        self.new_button.grid(row=0, column=2)
        self.output = tk.Text(frame, height=14, width=70, wrap="word", state="disabled")
        self.output.grid(row=3, column=0, columnspan=2, sticky="nsew", pady=4)
        self.status = tk.StringVar(value=f"{len(rt.tasks)} tasks · {rt.backend.name}")
        ttk.Label(frame, textvariable=self.status).grid(row=4, column=0, columnspan=2, sticky="w")
        root.protocol("WM_DELETE_WINDOW", self.quit)
        root.after(20, self.poll)
        self.new_chat()

    # -- actions --------------------------------------------------------------------------
    def new_chat(self) -> None:
        if self.stream is not None and not self.stream.done:
            self.stream.cancel()
        task = self.task.get()
        self.conv = self.rt.chat(task) if task and self.rt.tasks[task].chat else None
        self.set_output("")
        self.status.set(f"new chat with {task}" if self.conv is not None
                        else f"{task}: one message at a time (not a chat task)")

    def run(self) -> None:
        text = self.input.get("1.0", "end").strip()
        if self.conv is None:
            self.set_output("")
        try:
            self.stream = (self.conv.stream(text) if self.conv is not None
                           else self.rt.stream(self.task.get(), text))
        except PrefixEdgeError as e:
            self.status.set(f"error: {e}")
            return
        self.input.delete("1.0", "end")
        self.append(f"{'' if not self.output_text() else chr(10) + chr(10)}You: {text}\n\nAssistant: ")
        self.reply = ""
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
                self.reply += value
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
                                    f"reused {s.cached_tokens} of {s.prefix_tokens + s.input_tokens} "
                                    "prompt tokens")
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
