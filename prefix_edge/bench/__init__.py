"""`prefix-edge bench`: measure.py (one bundle's tasks: cached vs prefilled TTFT, decode, cold
start, memory, peers as subprocesses) and concurrency.py (many requests at once)."""
