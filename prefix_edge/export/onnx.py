"""HF model dir → ONNX decoder graph (optimum-onnx, `text-generation-with-past`)."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

from ..errors import PrefixEdgeError


def export_onnx(hf_dir: Path, out_dir: Path) -> Path:
    """Export an fp32 graph with past KV inputs; return the path of model.onnx."""
    from optimum.exporters.onnx import main_export

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("optimum", "transformers", "torch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            main_export(str(hf_dir), output=str(out_dir), task="text-generation-with-past",
                        device="cpu", do_validation=False, no_post_process=True,
                        library_name="transformers")
    except Exception as e:
        raise PrefixEdgeError(f"ONNX export of {hf_dir} failed: {type(e).__name__}: {e}") from None
    path = out_dir / "model.onnx"
    if not path.is_file():
        raise PrefixEdgeError(f"ONNX export of {hf_dir} produced no model.onnx")
    return path
