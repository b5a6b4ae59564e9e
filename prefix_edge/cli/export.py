"""`prefix-edge export`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .app import app


@app.command()
def export(
    model: Optional[Path] = typer.Argument(None, help="HF model dir or .gguf file (default: the embedded SmolLM2-135M-Instruct)."),
    tasks: Optional[Path] = typer.Option(None, "--tasks", help="Task file (TOML). Default with no MODEL: the demo tasks."),
    out: Optional[Path] = typer.Option(None, "--out", help="Bundle dir (default: the default bundle under $PREFIX_EDGE_HOME)."),
    format: Optional[str] = typer.Option(None, "--format", help="Comma-separated backends to build: onnx, gguf (default: both; gguf is skipped with a warning where llama.cpp cannot run)."),
    quantize: str = typer.Option("int4", "--quantize", help="ONNX weights: none | int8 | int4 (or an int4 recipe, e.g. int4:block=32,sym=1,acc=4,embed=8,head=8)."),
    gguf_quant: Optional[str] = typer.Option(None, "--gguf-quant", help="GGUF weights: keep | f32 | f16 | q8_0 | q4_k_m | q4_1 | ... (default: keep a .gguf source's type; q8_0 for an HF dir)."),
    prefix_store: str = typer.Option("f32", "--prefix-store", help="How ONNX task prefixes store their KV: f32 (exact: baked == prefilled) | f16 | q8_0 (4.3x smaller; measured agreement: docs/quantization.md, Prefix storage)."),
    onnx_builder: str = typer.Option("own", "--onnx-builder", help="ONNX graph: own (fused GroupQueryAttention graph built from the weights; Llama, Mistral, Qwen2/3, Phi-3, SmolLM3, Granite, Gemma 3) | optimum (optimum's export + ORT fusions; any architecture optimum knows, and CUDA)."),
    gguf_kv: str = typer.Option("f16", "--gguf-kv", help="llama.cpp KV cache type the GGUF prefixes are baked in and the runtime computes in: f16 | q8_0 (half the prefix bytes and KV memory; runs with flash attention; measured: docs/quantization.md)."),
    compress_prefix: Optional[str] = typer.Option(None, "--compress-prefix", help="Compress text tasks' prefixes: RATIO (prefix tokens per kept token, e.g. 2) | auto (per task, the largest of 4, 3, 2, 1.5 that keeps 90% reconstruction agreement) | none. Keeps the tokens the prefix's last tokens attend to most (where every input joins); docs/compression.md."),
    mtp_head: Optional[Path] = typer.Option(None, "--mtp-head", help="A .gguf model's MTP head GGUF (llama.cpp's converter --mtp writes one, mtp-*.gguf), kept in the bundle for speculative=\"mtp\" (default: the one mtp-*.gguf beside the model that fits it)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing bundle at --out."),
) -> None:
    """Export a model and its tasks into a bundle with precomputed task prefixes."""
    from ..export.build import export_bundle
    from ..paths import default_bundle

    if out is None:
        out = default_bundle()
        force = force or model is None  # the default bundle is rebuilt in place
    manifest = export_bundle(model, tasks, out, formats=None if format is None else [f.strip() for f in format.split(",") if f.strip()],
                             quantize=quantize, gguf_quant=gguf_quant, force=force,
                             prefix_store=prefix_store, onnx_builder=onnx_builder, gguf_kv=gguf_kv,
                             compress_prefix=compress_prefix, mtp_head=mtp_head)
    typer.echo(f"bundle written to {out}")
    typer.echo(json.dumps({n: t.prefix_tokens for n, t in manifest.tasks.items()}) + " prefix tokens")
    for n, t in manifest.tasks.items():
        c = t.compression
        if c:
            typer.echo(f"task {n}: {c['kept_tokens']} of {c['source_tokens']} prefix tokens kept "
                       f"(ratio {c['ratio']}, reconstruction agreement {c['reconstruction_agreement']:.3f})")
