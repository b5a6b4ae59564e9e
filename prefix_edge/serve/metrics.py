"""Prometheus text exposition for the server (the format is a few lines of text: no dependency)."""

from __future__ import annotations

import threading
from collections import Counter

TTFT_BUCKETS_MS = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.requests: Counter = Counter()  # (model, status) -> n
        self.prompt_tokens = 0
        self.cached_tokens: Counter = Counter()  # source (Stats.cached_from) -> positions reused
        self.completion_tokens = 0
        self.ttft_counts = [0] * (len(TTFT_BUCKETS_MS) + 1)
        self.ttft_sum_ms = 0.0
        self.finish: Counter = Counter()
        self.disconnected = 0

    def count(self, model: str, status: int) -> None:
        with self._lock:
            self.requests[(model, status)] += 1

    def observe(self, model: str, result) -> None:
        s = result.stats
        with self._lock:
            self.requests[(model, 200)] += 1
            self.prompt_tokens += s.prefix_tokens + s.input_tokens
            self.cached_tokens.update(s.cached_from or {"task_prefix": s.cached_tokens})
            self.completion_tokens += s.generated_tokens
            self.finish[s.finish_reason] += 1
            i = next((k for k, b in enumerate(TTFT_BUCKETS_MS) if s.ttft_ms <= b), len(TTFT_BUCKETS_MS))
            self.ttft_counts[i] += 1
            self.ttft_sum_ms += s.ttft_ms

    def render(self, engine: dict, memory: dict | None = None) -> str:
        """The counters, the engine's gauges and `memory`: {store: {bytes, budget_bytes}} (each
        store the server keeps, docs/server.md "What bounds the server's memory")."""
        with self._lock:
            out = ["# TYPE prefix_edge_requests_total counter"]
            for (model, status), n in sorted(self.requests.items()):
                out.append(f'prefix_edge_requests_total{{model="{model}",status="{status}"}} {n}')
            out += ["# TYPE prefix_edge_finish_total counter"]
            out += [f'prefix_edge_finish_total{{reason="{r}"}} {n}' for r, n in sorted(self.finish.items())]
            out += ["# TYPE prefix_edge_prompt_tokens_total counter",
                    f"prefix_edge_prompt_tokens_total {self.prompt_tokens}",
                    "# TYPE prefix_edge_cached_prompt_tokens_total counter",
                    f"prefix_edge_cached_prompt_tokens_total {sum(self.cached_tokens.values())}",
                    "# TYPE prefix_edge_cached_prompt_tokens_by_source_total counter"]
            out += [f'prefix_edge_cached_prompt_tokens_by_source_total{{source="{k}"}} {self.cached_tokens[k]}'
                    for k in ("task_prefix", "prompt_cache", "documents")]
            out += ["# TYPE prefix_edge_completion_tokens_total counter",
                    f"prefix_edge_completion_tokens_total {self.completion_tokens}",
                    "# TYPE prefix_edge_client_disconnects_total counter",
                    f"prefix_edge_client_disconnects_total {self.disconnected}",
                    "# TYPE prefix_edge_ttft_seconds histogram"]
            cum = 0
            for b, n in zip(TTFT_BUCKETS_MS, self.ttft_counts):
                cum += n
                out.append(f'prefix_edge_ttft_seconds_bucket{{le="{b / 1000}"}} {cum}')
            cum += self.ttft_counts[-1]
            out += [f'prefix_edge_ttft_seconds_bucket{{le="+Inf"}} {cum}',
                    f"prefix_edge_ttft_seconds_sum {self.ttft_sum_ms / 1000:.6f}",
                    f"prefix_edge_ttft_seconds_count {cum}"]
        out += ["# TYPE prefix_edge_prefix_restores_total counter",
                f"prefix_edge_prefix_restores_total {engine.get('resident_restores', 0)}",
                "# TYPE prefix_edge_prefix_resident_hits_total counter",
                f"prefix_edge_prefix_resident_hits_total {engine.get('resident_hits', 0)}",
                "# TYPE prefix_edge_active_requests gauge",
                f"prefix_edge_active_requests {engine.get('active', 0)}",
                "# TYPE prefix_edge_waiting_requests gauge",
                f"prefix_edge_waiting_requests {engine.get('waiting', 0)}"]
        emb = engine.get("embeddings") or {}  # runtime/embedding.py: texts, not calls, but for the last two
        for name, kind, key in (("waiting_texts", "gauge", "waiting_texts"),
                                ("waiting_tokens", "gauge", "waiting_tokens"),
                                ("running_texts", "gauge", "running_texts"),
                                ("cancelled_total", "counter", "cancelled"),
                                ("refused_total", "counter", "refused")):
            out += [f"# TYPE prefix_edge_embeddings_{name} {kind}", f"prefix_edge_embeddings_{name} {emb.get(key, 0)}"]
        prompts = engine.get("prompt_cache") or {}
        out += ["# TYPE prefix_edge_prompt_cache_hits_total counter",
                f"prefix_edge_prompt_cache_hits_total {prompts.get('hits', 0)}",
                "# TYPE prefix_edge_prompt_cache_misses_total counter",
                f"prefix_edge_prompt_cache_misses_total {prompts.get('misses', 0)}",
                "# TYPE prefix_edge_prompt_cache_hit_tokens_total counter",
                f"prefix_edge_prompt_cache_hit_tokens_total {prompts.get('hit_tokens', 0)}",
                "# TYPE prefix_edge_prompt_cache_bytes gauge",
                f"prefix_edge_prompt_cache_bytes {prompts.get('bytes', 0)}",
                "# TYPE prefix_edge_prompt_cache_budget_bytes gauge",
                f"prefix_edge_prompt_cache_budget_bytes {prompts.get('budget_bytes', 0)}"]
        host = engine.get("host_cache") or {}  # the two caches' one budget (cache/budget.py)
        for name, kind, key in (("bytes", "gauge", "bytes"), ("budget_bytes", "gauge", "budget_bytes"),
                                ("evictions_total", "counter", "evictions")):
            out += [f"# TYPE prefix_edge_host_cache_{name} {kind}", f"prefix_edge_host_cache_{name} {host.get(key, 0)}"]
        created = engine.get("created_tasks") or {}  # tasks made at run time (runtime/tasks.py)
        for name, key in (("count", "count"), ("bytes", "bytes"), ("budget_bytes", "budget_bytes")):
            out += [f"# TYPE prefix_edge_created_tasks_{name} gauge",
                    f"prefix_edge_created_tasks_{name} {created.get(key, 0)}"]
        docs = engine.get("document_cache") or {}
        for name, kind, key in (("hits_total", "counter", "hits"), ("misses_total", "counter", "misses"),
                                ("evictions_total", "counter", "evictions"), ("bytes", "gauge", "bytes"),
                                ("budget_bytes", "gauge", "budget_bytes")):
            out += [f"# TYPE prefix_edge_document_cache_{name} {kind}",
                    f"prefix_edge_document_cache_{name} {docs.get(key, 0)}"]
        if "disk_files" in prompts:  # the persistent tier (serve --prompt-cache-disk)
            for name, kind, key in (("files", "gauge", "disk_files"), ("bytes", "gauge", "disk_bytes"),
                                    ("budget_bytes", "gauge", "disk_budget_bytes"),
                                    ("loads_total", "counter", "disk_loads"),
                                    ("writes_total", "counter", "disk_writes"),
                                    ("refused_total", "counter", "disk_refused")):
                out += [f"# TYPE prefix_edge_prompt_cache_disk_{name} {kind}",
                        f"prefix_edge_prompt_cache_disk_{name} {prompts.get(key, 0)}"]
        if memory:
            out.append("# TYPE prefix_edge_memory_bytes gauge")
            out += [f'prefix_edge_memory_bytes{{store="{k}"}} {v["bytes"]}' for k, v in sorted(memory.items())]
            out.append("# TYPE prefix_edge_memory_budget_bytes gauge")
            out += [f'prefix_edge_memory_budget_bytes{{store="{k}"}} {v["budget_bytes"]}'
                    for k, v in sorted(memory.items())]
            stored = memory.get("stored_responses")
            if stored and "count" in stored:
                out += ["# TYPE prefix_edge_stored_responses gauge",
                        f"prefix_edge_stored_responses {stored['count']}",
                        "# TYPE prefix_edge_stored_responses_max gauge",
                        f"prefix_edge_stored_responses_max {stored['max_count']}"]
        return "\n".join(out) + "\n"
