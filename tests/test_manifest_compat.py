"""A bundle exported by an earlier version opens unchanged: tests/data/manifest-2026-12-01.json
is the default bundle's manifest as the version of 2026-12-01 (a2adf33) wrote it, before the
manifest gained the model's sliding-window fields. Its recorded fingerprints, computed by that
version, must be what this version computes from it, or every bundle already deployed would be
refused as "mixed"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from prefix_edge.bundle import Manifest

DATA = Path(__file__).parent / "data" / "manifest-2026-12-01.json"


def test_older_manifest_fingerprints_unchanged(tmp_path):
    shutil.copy(DATA, tmp_path / "manifest.json")
    m = Manifest.read(tmp_path)
    recorded = json.loads(DATA.read_text())["backends"]
    assert set(recorded) == {"onnx", "gguf"}
    for backend, info in recorded.items():
        assert m.fingerprint(backend) == info["fingerprint"], backend
    assert m.model.sliding_layers == [] and m.model.sliding_window == 0
