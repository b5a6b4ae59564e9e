"""The scheduler: one engine thread that runs every request of a Runtime (loop.py), a step
planned as data before it runs (plan.py), a request as the caller's Call and its run
(request.py), task prefixes kept resident (residents.py) and drafts verified (drafting.py)."""

from .loop import Scheduler
from .request import Call, Request

__all__ = ["Call", "Request", "Scheduler"]
