"""benchmarks/prefix_cache_disk.py run as a script (torch backend, tiny shape, 3 requests): the
rerun hits the disk for every prompt, prefills nothing and gives the same tokens."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_prefix_cache_disk_benchmark_smoke(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "prefix_cache_disk.py"), "--models", "tiny",
                             "--backend", "torch", "--requests", "3", "--out", str(out)],
                            capture_output=True, text=True, timeout=600, cwd=ROOT,
                            env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
                                 "XDG_CACHE_HOME": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    (r,) = json.loads(out.read_text())["results"]
    assert r["same_tokens"] and r["system_prompt_tokens"] == 1000
    rerun, cold = r["scenarios"]["disk_rerun"], r["scenarios"]["memory_only"]
    assert rerun["prefilled_tokens"] == 0 and rerun["prefix_hits"] == 3
    assert cold["prefilled_tokens"] >= 1000 and cold["prefill_s"] > rerun["prefill_s"]
