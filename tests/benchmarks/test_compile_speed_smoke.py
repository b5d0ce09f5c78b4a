"""benchmarks/compile_speed.py's H200 section on the tiny shape, run as the script it is: both
layer loops compile deviceless (4 layers), the scanned step has one while loop whose body runs
once per layer after the first, the unrolled step none; the JSON and markdown are written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rwkv_jax.deviceless import PLUGIN_DIR_ENV
from tests.gpu_target import PLUGIN_DIR

ROOT = Path(__file__).resolve().parents[2]


def test_h200_section_counts_the_scan_body_per_layer(tmp_path):
    out = tmp_path / "compile_speed.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), PLUGIN_DIR_ENV: PLUGIN_DIR}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compile_speed.py"), "--sections", "h200",
                             "--h200-configs", "tiny", "--h200-batch", "2", "--h200-layers", "4", "--out", str(out)],
                            capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r["loop"]: r for r in json.loads(out.read_text())["h200"]}
    assert rows["unrolled"]["while_loops"] == 0
    assert rows["unrolled"]["launches_executed"] == rows["unrolled"]["launches_listed"] > 0
    scan = rows["scan"]
    assert scan["while_loops"] == 1 and scan["body_launches"] > 0
    assert scan["launches_executed"] == scan["launches_listed"] + scan["body_launches"] * 2  # 3 runs
    assert all(r["compile_s"] > 0 for r in rows.values())
    assert "launches executed / step" in out.with_suffix(".md").read_text()
