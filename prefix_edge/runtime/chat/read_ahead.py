"""Reading a conversation's reply ahead, so that its next turn does not read it again.

The prompt cache keeps a prompt's state before its first decoded token (a hit must equal a
miss, and a decoded token's KV differs from a prefilled one's in the last bits), so a
conversation's next turn restores the previous *prompt* and prefills the previous reply again:
with long replies that is seconds per turn on a small device, growing with every turn.

So, once a conversation's call has ended (the server's chat completions and Responses calls
with messages, `rt.generate(messages=...)`, a `Conversation`), its prompt and its reply, as the
next turn will render them (the messages, the reply as an assistant message, a placeholder user
message after it), are read up to the reply's end — the next turn's cut there — by a background
request, in the same chunks the next turn would use, and that state goes into the prompt cache.
The next turn then hits at the reply's end and prefills only its new message: the same KV a cold
prefill gives, so its answer is the cold answer (tests/test_conversation.py).

The background request starts only once the runtime is idle (a free slot, nothing waiting;
it waits up to WAIT_S for that), and gives way to a request that needs its sequence; at most
one reply waits to be read here (a newer one replaces it). Off: Runtime.open(read_ahead=False).
"""

from __future__ import annotations

import queue
import threading
import time

from ...errors import PrefixEdgeError, RuntimeBusy, RuntimeClosed

ENDS = ("eos", "stop", "length")  # a reply a client sends back as it is
PLACEHOLDER = {"role": "user", "content": "."}  # the next message, unknown: only its start matters
POLL_S, WAIT_S = 0.02, 60.0  # how often, and how long, it waits for the runtime to be idle


class ReadAhead:
    def __init__(self, requests, scheduler, enabled: bool = True):
        self.requests, self.sched, self.enabled = requests, scheduler, enabled
        self.done = self.skipped = 0  # replies read ahead; skipped (busy, no cut, an error)
        self.why = ""  # why the last one was skipped
        self._jobs: queue.Queue = queue.Queue(1)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)  # notified when a job is over
        self._outstanding = 0  # jobs queued or being read
        self._closed = False

    def after(self, req, result, reason: str) -> None:
        """A call has ended (its consumer's thread): queue its reply to be read ahead."""
        if not self.enabled or req.call.follow is None or reason not in ENDS or not result.text \
                or result.tool_calls or req.siblings or req.parent is not None:
            return
        task, messages, scope = req.call.follow
        job = (task, list(messages) + [{"role": "assistant", "content": result.text}, PLACEHOLDER], scope)
        with self._lock:
            if self._closed:
                return
            try:
                self._jobs.get_nowait()  # an older reply not read yet: the newer one replaces it
                self.skipped += 1
            except queue.Empty:
                self._outstanding += 1
            self._jobs.put_nowait(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="prefix-edge-read-ahead", daemon=True)
                self._thread.start()

    def _idle(self) -> bool:
        """Wait until the runtime has a free slot and nothing waiting (False: a newer reply
        came meanwhile, or WAIT_S passed, or closing)."""
        for _ in range(int(WAIT_S / POLL_S)):
            if self._closed or not self._jobs.empty():
                return False
            if self.sched.idle_for_background():
                return True
            time.sleep(POLL_S)
        return False

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._read(job)
            finally:
                with self._lock:
                    self._outstanding -= 1
                    self._settled.notify_all()

    def settle(self, timeout: float) -> bool:
        """Wait until no reply waits or is being read (True), or `timeout` seconds pass (False):
        for a caller who wants the next turn to find the reply read (a test, a benchmark)."""
        with self._settled:
            return self._settled.wait_for(lambda: self._outstanding == 0, timeout)

    def _read(self, job) -> None:
        if not self._idle():
            with self._lock:
                self.skipped += 1
            return
        task, messages, scope = job
        over = {"max_tokens": 1, "temperature": 0.0, "use_constraint": False}
        if scope:
            over["cache_scope"] = scope
        try:
            r = self.requests.request(task, None, over, messages, read_ahead=True)
            self.sched.submit(r)
            while True:  # its one token: the state was kept when the prompt was read
                kind, value = r.events.get()
                if kind in ("done", "error"):
                    break
            kept = kind == "done" and value in ENDS  # not "cancelled": it gave way
            with self._lock:
                self.done += kept
                self.skipped += not kept
        except (PrefixEdgeError, RuntimeBusy, RuntimeClosed) as e:
            with self._lock:
                self.skipped += 1
                self.why = str(e)

    def info(self) -> dict:
        with self._lock:
            return {"done": self.done, "skipped": self.skipped, "pending": self._jobs.qsize(),
                    "last_skip": self.why}

    def close(self) -> None:
        """No more replies read ahead; the one in flight ends with the scheduler's close (the
        runtime closes it next, then calls join)."""
        with self._lock:
            self._closed = True
            try:
                self._jobs.get_nowait()
                self._outstanding -= 1
                self._settled.notify_all()
            except queue.Empty:
                pass
            self._jobs.put_nowait(None)

    def join(self) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(30)
