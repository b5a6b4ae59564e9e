"""Stored responses (`/v1/responses` with `store`) shared by every replica of the cluster.

    ResponseStore       one Serve deployment (one actor) holding each stored response as JSON
                        bytes, the least recently used dropped beyond a byte budget; a replica
                        killed takes none of them with it
    SharedResponses     a replica's `stored` (serve/responses.py's mapping of them): a view
                        of the store, holding nothing itself, so every replica sees the same
                        responses (`previous_response_id` works whichever replica answers)
                        and a deleted one is gone for all

Ordering: a write is sent when the response is stored (before its last event or its JSON
leaves the replica) and the replica holds that output back until the store has acknowledged
it (`settle`), so a client that chains from a response it has received always finds it.
A read (`previous_response_id`) waits for the store in the worker thread that parses the
body, never on the event loop. The ingress answers `GET` and `DELETE /v1/responses/{id}`
from the store itself (one hop, no replica).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict

from ray import serve

from ..serve.store import frozen

log = logging.getLogger("prefix_edge.cluster")
WAIT = 10.0  # seconds a replica waits for the store (restarting) before going on without it
ENTRY = 256  # bytes counted per response beyond its JSON (the dict's slot, the key, the tuple)


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
class ResponseStore:
    """Stored responses by id: (the response's JSON, the conversation's JSON), within a budget
    of bytes, the least recently used dropped first. Its methods run on its event loop, one at
    a time, and never wait on anything."""

    def __init__(self, budget_bytes: int):
        self.budget = int(budget_bytes)
        self.items: OrderedDict[str, tuple[bytes, bytes]] = OrderedDict()
        self.bytes = self.evictions = self.refused = 0

    async def put(self, rid: str, response: bytes, messages: bytes) -> bool:
        await self.delete(rid)
        size = ENTRY + len(response) + len(messages)
        if size > self.budget:
            self.refused += 1
            return False
        self.items[rid] = (response, messages)
        self.bytes += size
        while self.bytes > self.budget:
            _, (a, b) = self.items.popitem(last=False)
            self.bytes -= ENTRY + len(a) + len(b)
            self.evictions += 1
        return True

    async def delete(self, rid: str) -> bool:
        old = self.items.pop(rid, None)
        if old is not None:
            self.bytes -= ENTRY + len(old[0]) + len(old[1])
        return old is not None

    async def get(self, rid: str) -> tuple[bytes, bytes] | None:
        got = self.items.get(rid)
        if got is not None:
            self.items.move_to_end(rid)
        return got

    async def stats(self) -> dict:
        return {"count": len(self.items), "bytes": self.bytes, "budget": self.budget,
                "evictions": self.evictions, "refused": self.refused}


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


class SharedResponses:
    """serve/responses.py's `stored` on a replica (id -> (response, messages), the calls it
    makes: `[] =`, get, `in`, `[]`, pop, len), every one answered by the ResponseStore. It
    holds none itself (len 0). On the event loop a write is sent without waiting (the replica
    `settle`s before its next output) and a read or a delete answers "not here": they belong
    to the worker thread that parses a body, and to the ingress."""

    def __init__(self, store):
        self.store = store  # a DeploymentHandle to ResponseStore
        self.pending: set[asyncio.Future] = set()

    def __setitem__(self, rid: str, entry: tuple) -> None:
        blobs = (frozen(entry[0]), frozen(entry[1]))  # the store keeps JSON: immutable
        if not _on_event_loop():  # a worker thread: it may wait
            try:
                self._ack(rid, self.store.put.remote(rid, *blobs).result(timeout_s=WAIT))
            except Exception as e:
                self._ack(rid, e)
            return
        fut = asyncio.ensure_future(self._put(rid, blobs))
        self.pending.add(fut)
        fut.add_done_callback(self.pending.discard)

    async def _put(self, rid: str, blobs: tuple[bytes, bytes]) -> None:
        try:
            self._ack(rid, await asyncio.wait_for(self.store.put.remote(rid, *blobs), WAIT))
        except Exception as e:
            self._ack(rid, e)

    @staticmethod
    def _ack(rid: str, kept: bool | Exception) -> None:
        if isinstance(kept, Exception):
            log.warning("stored response %s not kept: the store did not answer (%s: %s)", rid,
                        type(kept).__name__, kept)
        elif not kept:
            log.warning("stored response %s is larger than the response store's budget", rid)

    async def settle(self) -> None:
        """Wait until every write sent so far is acknowledged (or failed)."""
        while self.pending:
            await asyncio.wait(list(self.pending))

    def _ask(self, method: str, rid):
        if not isinstance(rid, str) or _on_event_loop():
            return None
        try:
            return getattr(self.store, method).remote(rid).result(timeout_s=WAIT)
        except Exception as e:
            log.warning("the response store did not answer (%s: %s)", type(e).__name__, e)
            return None

    def get(self, rid, default=None):
        got = self._ask("get", rid)
        return default if got is None else (json.loads(got[0]), json.loads(got[1]))

    def __getitem__(self, rid):
        got = self.get(rid)
        if got is None:
            raise KeyError(rid)
        return got

    def __contains__(self, rid) -> bool:
        return self.get(rid) is not None

    def pop(self, rid, default=None):
        got = self.get(rid)
        if got is None or not self._ask("delete", rid):
            return default
        return got

    def __len__(self) -> int:
        return 0

    def popitem(self, last: bool = True):
        raise KeyError("the responses are held by the response store")
