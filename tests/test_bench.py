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
    from prefix_edge.export.onnx import optimum_unavailable

    for row in r["decode"]:
        assert row["tok_s"] > 0
        if row["backend"] == "onnx" and optimum_unavailable():  # optimum's generate is ONNX's peer
            assert "optimum" in row["baseline"]["error"] and row["ratio"] is None, row
        else:
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


def test_bench_speculative_report(bundle_int4, tmp_path):
    """`prefix-edge bench --speculative`: a row per engine and task with held-out inputs (the
    demo tasks' sets: support, sentiment, extract; `raw` has none and is skipped), "off" at one
    token per forward, and a JSON task's answers counted; `--inputs FILE` gives every task
    inputs; a malformed file is one error line."""
    out = tmp_path / "s.json"
    p = cli("bench", "--speculative", "--bundle", bundle_int4, "--runs", "2", "--threads", "2",
            "--no-peers", "--out", out)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert sorted((r["backend"], r["task"]) for r in rows) == sorted(
        (b, t) for b in ("onnx", "gguf") for t in ("support", "sentiment", "extract"))
    for r in rows:
        assert r["n"] == 2 and r["off"]["tokens_per_forward"] == 1.0 and r["off"]["drafted"] == 0
        assert r["lookup"]["tokens_per_forward"] >= 1.0 and 0 <= r["equal"] <= 2
        assert (r["json_valid"] is not None) == (r["task"] == "extract")
        assert 0.0 <= r["row_cost"] <= 1.5  # the runtime's measured cost of a verified row
    assert "no held-out inputs" in p.stderr.decode() and "| engine | task |" in p.stdout.decode()
    assert "A verified row's cost as a share of a one-token step, measured by the runtime: onnx" in p.stdout.decode()
    given = tmp_path / "inputs.jsonl"
    given.write_text('{"input": "hello there"}\n{"task": "raw", "input": "le chat"}\n', encoding="utf-8")
    p = cli("bench", "--speculative", "--bundle", bundle_int4, "--backend", "gguf", "--runs", "1",
            "--no-peers", "--inputs", given, "--out", out)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    assert {r["task"] for r in json.loads(out.read_text())["rows"]} == {"support", "sentiment", "extract", "raw"}
    given.write_text('{"text": "no input key"}\n', encoding="utf-8")
    p = cli("bench", "--speculative", "--bundle", bundle_int4, "--inputs", given)
    err = p.stderr.decode().strip()
    assert p.returncode == 1 and "inputs.jsonl:1: not a JSON object with an \"input\" string" in err
    assert len(err.splitlines()) == 1, err


def test_bench_contention_report(bundle_int4):
    """`bench --contention`'s rows (idle and beside a real busy process, threads auto / fixed / 1,
    both engines): every figure measured, and auto running one thread beside a process that keeps
    a CPU busy on a 2-CPU machine (what it runs, not how fast)."""
    from prefix_edge.bench.contention import run_all, table
    from prefix_edge.runtime.engines.cpu_share import cpu_share

    report = run_all(bundle_int4, ["onnx", "gguf"], 2, runs=1, max_tokens=4, log=lambda m: None,
                     loads=("idle", "busy loop"))
    rows = report["rows"]
    assert [(r["engine"], r["beside"], r["threads"]) for r in rows] == [
        (e, load, t) for e in ("onnx", "gguf") for load in ("idle", "busy loop")
        for t in ("auto", "fixed 2", "1 thread")]
    for r in rows:
        assert r["ttft_ms"] > 0 and r["prefilled_ttft_ms"] > 0 and r["decode_tok_s"] > 0
        assert (r["auto_threads_now"] is not None) == (r["threads"] == "auto")
    if cpu_share().allowed == 2:
        assert all(r["auto_threads_now"] == 1 for r in rows if r["beside"] == "busy loop" and r["threads"] == "auto")
    lines = table(report)
    assert lines[0].startswith("| engine | beside | threads |") and len(lines) == 2 + len(rows)
