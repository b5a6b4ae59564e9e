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
    for row in r["decode"]:
        assert row["tok_s"] > 0
        assert row["baseline"]["tok_s"] > 0, row  # the peer ran in its own process
    for row in r["cold_start"]:
        assert row["torch_in_process"] is False and row["peak_rss_mb"] > 0
    assert r["machine"]["threads"] == 2 and r["targets"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
