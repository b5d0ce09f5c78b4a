"""`rwkv7-gpu-compile`, run as the program it is: deviceless H200 compiles of the tiny shape
(a table on stdout, the JSON the issue names, exit 0), a compile that fails on a GPU with too
little shared memory (exit 1, the failure in the JSON), and bad options (exit 2, one line)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from rwkv_jax import deviceless
from tests.gpu_target import PLUGIN_DIR, ROOT


def run(*args, timeout=900):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), deviceless.PLUGIN_DIR_ENV: PLUGIN_DIR}
    return subprocess.run([sys.executable, "-m", "rwkv7_apps.tools.gpu_compile", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def test_compiles_buckets_prints_a_table_and_writes_json(tmp_path):
    out = tmp_path / "r.json"
    result = run("--shape", "tiny", "--kernels", "pallas", "--buckets", "1x1,4x1,2x17", "--json", str(out), "--strict")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "NVIDIA H200" in result.stdout and "3/3 buckets compiled" in result.stdout
    assert re.search(r"^\s+4x1\s+step\s+BATCHED_DECODE\s+[\d.]+\s+\d+", result.stdout, re.M)
    doc = json.loads(out.read_text())
    assert doc["target"] == "h200" and doc["jax_version"] and doc["resource_problems"] == []
    assert re.fullmatch(r"jax-cuda1[23]-plugin \S+", doc["cuda_plugin"]) and doc["ptxas"], doc
    assert doc["cuda_plugin"] in result.stdout
    rows = {(b["B"], b["T"]): b for b in doc["buckets"]}
    assert set(rows) == {(1, 1), (4, 1), (2, 17)}
    for row in rows.values():
        assert row["ok"] and row["error"] is None and row["compile_s"] > 0 and row["launches"] > 0
        for k in row["kernels"]:
            assert set(k) >= {"name", "grid", "threads", "registers", "spill_bytes", "shared_bytes"}
    wkv = [k for k in rows[(4, 1)]["kernels"] if k["name"] == "rwkv7_wkv_step"]
    assert wkv and wkv[0]["grid"] == [4, 2, 1] and wkv[0]["registers"] > 0 and wkv[0]["spill_bytes"] == 0
    assert rows[(2, 17)]["path"] == "DENSE" and rows[(1, 1)]["path"] == "B1T1"


def test_a_failing_compile_exits_1_and_is_recorded(tmp_path):
    """A GPU whose blocks get 1 KB of shared memory cannot hold the small-M product's tiles."""
    small = tmp_path / "small_gpu.txtpb"
    text = deviceless.load_target("h200").text
    small.write_text(re.sub(r"shared_memory_per_block_optin: \d+", "shared_memory_per_block_optin: 1024",
                            re.sub(r"shared_memory_per_block: \d+", "shared_memory_per_block: 1024", text)))
    out = tmp_path / "r.json"
    result = run("--shape", "tiny", "--buckets", "2x1", "--target", str(small), "--json", str(out))
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "FAILED" in result.stdout
    row = json.loads(out.read_text())["buckets"][0]
    assert not row["ok"] and "shared memory" in row["error"].lower()


def test_bad_options_exit_2_with_one_line():
    for args, needle in ((["--shape", "tiny", "--buckets", "2xq"], "bad bucket"),
                         (["--shape", "tiny", "--target", "h999"], "unknown GPU target"),
                         (["--model", "/nonexistent.pth"], "no such file"),
                         (["--shape", "tiny", "--kernels", "pallas,cuda"], "unknown ['cuda']")):
        result = run(*args, timeout=300)
        assert result.returncode == 2 and needle in result.stderr, (args, result.stderr[-1000:])
