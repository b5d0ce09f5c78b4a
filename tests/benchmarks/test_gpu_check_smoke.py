"""benchmarks/gpu_check.py --smoke, run as the script it is: every CPU-side piece of the GPU
script runs on tiny shapes (interpret-mode kernels) and writes a complete JSON + markdown
report; without --smoke on a CPU it refuses to start."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from rwkv_jax.deviceless import PLUGIN_DIR_ENV
from tests.gpu_target import PLUGIN_DIR

ROOT = Path(__file__).resolve().parents[2]


def run_script(*args, timeout=900):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), PLUGIN_DIR_ENV: PLUGIN_DIR}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_gpu_check_smoke_writes_a_complete_report(tmp_path):
    result = run_script("--smoke", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert results["smoke"] and results["interpret"]
    parity = results["parity"]
    assert parity["ok"], parity
    assert parity["kernels"] and parity["sparse"] and parity["models"]
    assert results["roofline"]["copy_GBps"] > 0 and results["roofline"]["bf16_matmul_TFLOPs"] > 0
    for row in results["kernels"]:
        assert row["pallas_us"] > 0 and row["xla_us"] > 0
    assert "value_sparse_us" in results["kernels"][-1]
    assert results["measured_sparse_max_rows"] in (0, 1)
    models = results["models"]
    assert {(r["B"], r["T"]) for r in models} == {(1, 1), (1, 8)}
    for row in models:
        assert row["tok_s"] > 0 and math.isfinite(row["roofline_fraction"])
    assert set(results["goals"]) and results["serving"]["status"] in ("absent", "skipped in --smoke")
    deviceless = results["deviceless"]  # the CPU side: compiled for the H200 and serialized
    assert deviceless["ok"] and deviceless["serialized_bytes"] > 0 and not deviceless["loaded"], deviceless
    fused = results["fused_decode"]["decode"][0]["pallas-fused-interpret"]  # the engine's whole step too
    assert "error" not in fused, fused
    assert fused["step_ms"] > 0 and fused["engine_step_greedy_ms"] > 0 and fused["engine_step_sampled_ms"] > 0
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "## Parity: all ok" in markdown and "## Models" in markdown and "engine_step_sampled_ms" in markdown


def test_gpu_check_refuses_a_full_run_without_gpu(tmp_path):
    result = run_script("--out", str(tmp_path), timeout=300)
    assert result.returncode != 0 and "needs a GPU" in result.stderr
