"""The demo tasks' train and held-out sets are what scripts/demo-data writes: seeded, so rerunning
the generators reproduces the packaged files byte for byte."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts" / "demo-data"
PACKAGED = ROOT / "prefix_edge" / "models" / "smollm2-135m" / "data"


@pytest.mark.parametrize("script", ["make_data.py", "make_task_data.py", "make_tool_data.py"])
def test_generators_reproduce_the_packaged_data(script, tmp_path):
    subprocess.run([sys.executable, str(SCRIPTS / script)], cwd=tmp_path, check=True, timeout=120,
                   env={**os.environ, "DEMO_DATA_DIR": str(tmp_path)}, capture_output=True)
    written = sorted(p.name for p in tmp_path.glob("*.jsonl"))
    assert written, script
    for name in written:
        assert (tmp_path / name).read_bytes() == (PACKAGED / name).read_bytes(), name
