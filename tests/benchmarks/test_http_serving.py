"""benchmarks/http_serving.py --smoke, run as the script it is: a real rwkv7-serve
subprocess and the in-process scheduler on the same small workload, JSON + markdown out."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.single_stack
def test_http_serving_smoke_writes_both_sides_and_the_overhead(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "http_serving.py"), "--smoke",
                             "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "http_serving_smoke.json").read_text())
    for side in ("http", "inprocess"):
        for level, row in results[side].items():
            assert row["requests"] == 8 and row["output_tokens"] > 0 and row["output_tok_s"] > 0, (side, level)
            assert row["ttft_ms"]["p50"] > 0
    for level in ("1", "4"):  # the same requests ran on both sides, to their full lengths
        assert results["http"][level]["output_tokens"] == results["inprocess"][level]["output_tokens"]
    assert set(results["overhead"]) == {"1", "4"}
    assert "HTTP layer overhead" in (tmp_path / "http_serving_smoke.md").read_text()
