"""`prefix-edge bench` on the tiny bundle: the report's shape, the peers run, the plot is written.
(No speed is asserted here: speed lives in the benchmark's own report, not in timed tests.)"""

from __future__ import annotations

import json

from .conftest import cli


def test_bench_report_and_plot(bundle_int4, tmp_path):
    out, plot = tmp_path / "report.json", tmp_path / "report.png"
    p = cli("bench", "--bundle", bundle_int4, "--prefix-lengths", "16,64", "--input-tokens", "8",
            "--runs", "2", "--threads", "2", "--out", out, "--plot", plot)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    r = json.loads(out.read_text())
    assert {row["backend"] for row in r["ttft"]} == {"onnx", "gguf"}
    assert [row["prefix_tokens"] for row in r["ttft"] if row["backend"] == "onnx"] == [16, 64]
    for row in r["ttft"]:
        assert row["ttft_prefilled_ms"] > 0 and row["ttft_restored_ms"] > 0 and row["bytes_per_prefix_token"] > 0
        assert row["ttft_restored_memory_ms"] > 0 and row["speedup_memory"] > 0
    for row in r["decode"]:
        assert row["tok_s"] > 0
        assert row["baseline"]["tok_s"] > 0, row  # the peer ran in its own process
    assert {row["backend"] for row in r["restore"]} == {"onnx", "gguf"}
    for row in r["restore"]:  # the first fresh process walks the file's values; the later ones skip it
        # (at least 5 later runs, each reported, whatever --runs says)
        assert row["walked"] == [True] + [False] * 5 and row["restore_ms"] > 0 and row["file_mb"] > 0
        assert len(row["later_ms"]) == 5 and abs(row["restore_ms"] - sorted(row["later_ms"])[2]) <= 0.01
    for row in r["cold_start"]:
        assert row["torch_in_process"] is False and row["peak_rss_mb"] > 0
        assert (row.get("cold_start_ms_no_session_cache", 0) > 0) == (row["backend"] == "onnx")
    assert r["machine"]["threads"] == 2 and r["targets"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_concurrency_report(bundle_int4, tmp_path):
    """`prefix-edge bench --concurrency` runs both engines under many requests; what it reports
    about sharing is checked (not its timings): on llama.cpp a request adds only its own cells."""
    import json

    from .conftest import cli

    out = tmp_path / "c.json"
    backends = "onnx,gguf"
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        backends = "onnx"
    p = cli("bench", "--concurrency", "--bundle", bundle_int4, "--backend", backends,
            "--threads", "1", "--out", out)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    rep = json.loads(out.read_text())
    for b in backends.split(","):
        r = rep[b]
        assert r["throughput"]["8"]["tokens"] == 8 * r["throughput"]["1"]["tokens"] > 0
        assert set(r["ttft_8_in_flight_ms"]) == {"p50", "p99"}
        assert 0 < r["cancel_ms"]["mid_decode_median"] < 10_000  # measured, and a cancel lands
    if "gguf" in rep:
        mem = rep["gguf_shared_kv"]["memory"]
        snap = mem["snapshots"]["8"]
        assert snap["requests"] == 8
        assert snap["shared_cells"] == mem["prefix_tokens"]  # one copy of the prefix, not 8
        assert mem["prefix_copies_held"] == 1.0
        # the default (a KV stream per request) holds a copy per request
        assert rep["gguf"]["memory"]["prefix_copies_held"] == 8.0
