"""benchmarks/gpu_check.py --smoke, run as the script it is: every CPU-side piece of the GPU
script runs on tiny shapes (interpret-mode kernels) and writes a complete JSON + markdown
report, parity first; a run killed mid-way leaves a readable report of what it finished;
without --smoke on a CPU it refuses to start."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from rwkv_jax.deviceless import PLUGIN_DIR_ENV
from tests.gpu_target import PLUGIN_DIR

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ["parity", "torch_parity", "roofline", "mosaic", "decode", "state_dtype", "deviceless", "quantized",
            "prefill", "models", "kernels", "serving", "http_serving", "data_parallel"]
KERNELS = {"pallas-interpret", "pallas-fused-interpret", "xla"}


def script(*args) -> tuple[list, dict]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), PLUGIN_DIR_ENV: PLUGIN_DIR}
    return [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *args], env


def interpreter_cannot_loop() -> bool:
    """Triton < 3.7 under numpy >= 2.5 (the GPU machine's stack): its interpreter cannot run
    a runtime-bounded loop (rwkv_torch_ref.triton_kernels.interpreter)."""
    version = lambda name: tuple(int(x) for x in metadata.version(name).split(".")[:2])  # noqa: E731
    return version("triton") < (3, 7) and version("numpy") >= (2, 5)


def run_script(*args, timeout=900):
    cmd, env = script(*args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_gpu_check_smoke_writes_a_complete_report(tmp_path):
    result = run_script("--smoke", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert results["smoke"] and results["interpret"]
    sections = results["sections"]
    assert list(sections) == SECTIONS  # parity of every kernel path first
    for name, part in sections.items():
        assert part["status"] == "ok" or (part["status"] == "skipped" and part["reason"]), (name, part)
    parity = sections["parity"]
    assert parity["ok"] and parity["kernels"] and parity["sparse"] and parity["fused_sparse"]
    assert "wkv_varlen" in " ".join(r["case"] for r in parity["kernels"])
    assert [r["verdict"] for r in parity["self_check"]] == ["passed"]  # kernels="auto"'s guard
    assert {r["kernels"] for r in parity["models"]} == KERNELS and all(r["ok"] for r in parity["models"])
    torch_parity = sections["torch_parity"]  # the Triton kernels, interpreted on the CPU
    pairs = {(p["kernels"], p["reference"]) for c in torch_parity["cases"] for p in c["pairs"]}
    assert torch_parity["ok"] and ("torch", "jax") in pairs, torch_parity
    if interpreter_cannot_loop():  # the interpreted Triton pairs are skipped, saying why
        assert torch_parity["triton"].startswith("skipped: triton") and len(pairs) == 1, torch_parity
    else:
        assert torch_parity["triton"].startswith("interpreted"), torch_parity
        assert pairs == {("triton", "torch"), ("triton", "jax"), ("torch", "jax")}
    assert sections["roofline"]["copy_GBps"] > 0 and sections["roofline"]["bf16_matmul_TFLOPs"] > 0
    decode = sections["decode"]
    assert {r["kernels"] for r in decode["rows"]} == KERNELS
    for row in decode["rows"] + sections["models"]["rows"]:
        assert row["tok_s"] > 0 and row["launches"] > 0 and math.isfinite(row["roofline_fraction"]), row
    engine, = decode["engine"]  # the engine's whole step (xla: the fused kernels on a GPU)
    assert engine["kernels"] == "xla", engine
    assert engine["engine_step_greedy_ms"] > 0 and engine["engine_step_sampled_ms"] > 0
    assert {(r["B"], r["T"]) for r in sections["models"]["rows"]} == {(1, 1)}
    prefill = sections["prefill"]["rows"]  # dense and varlen prefill rows, with the roofline that binds
    assert [r["kind"] for r in prefill] == ["dense", "varlen"], prefill
    for row in prefill:
        assert row["tok_s"] > 0 and row["binding"] in ("compute", "bandwidth") and row["roofline_fraction"] > 0, row
    assert [r["ok"] for r in sections["quantized"]["parity"]] == [True]  # interpreted on the CPU
    quantized, = sections["quantized"]["rows"]  # the int8 row's code path (params drawn quantized)
    assert quantized["quantization"] == "int8" and quantized["tok_s"] > 0, quantized
    assert 0 < quantized["hbm_roofline_fraction"] and quantized["params_bytes"] > 0
    kernels = sections["kernels"]
    assert all(r["pallas_us"] > 0 and r["xla_us"] > 0 for r in kernels["rows"])
    assert "value_sparse_us" in kernels["rows"][-1] and kernels["measured_sparse_max_rows"] in (0, 1)
    deviceless = sections["deviceless"]  # the CPU side: compiled for the H200 and serialized
    assert deviceless["ok"] and deviceless["serialized_bytes"] > 0 and not deviceless["loaded"], deviceless
    assert results["summary"]["goals"] and results["elapsed_s"] > 0
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "## parity: ok" in markdown and "## torch_parity: ok" in markdown and "## decode: ok" in markdown
    assert "## prefill: ok" in markdown
    assert "whole decode step" in markdown


@pytest.mark.single_stack
def test_gpu_check_killed_after_parity_leaves_a_readable_report(tmp_path):
    cmd, env = script("--smoke", "--out", str(tmp_path))
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own group: the kill takes the torch child too
    report = tmp_path / "gpu_check.json"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if report.exists() and json.loads(report.read_text())["sections"].get("parity", {}).get("status") == "ok":
                break
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    results = json.loads(report.read_text())  # written atomically: never half a file
    assert list(results["sections"])[0] == "parity" and results["sections"]["parity"]["ok"]
    assert "elapsed_s" not in results and (tmp_path / "gpu_check.md").exists()


def test_gpu_check_refuses_a_full_run_without_gpu(tmp_path):
    result = run_script("--out", str(tmp_path), timeout=300)
    assert result.returncode != 0 and "needs a GPU" in result.stderr
