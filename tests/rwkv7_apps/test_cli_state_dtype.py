"""--state-dtype end to end on the tiny model: rwkv7-generate (torch backend) reports it in
the --metrics JSON and writes state files in it; a state file of another state dtype fails at
start with one line naming it; rwkv7-serve (jax backend) reports it in /v1/models."""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np

from rwkv7_core.checkpoint import read_checkpoint, read_safetensors
from rwkv7_core.state_files import load_state
from tests.rwkv7_apps.cli_harness import read_results, run_cli, write_jsonl
from tests.rwkv7_apps.serve_harness import running_server

V = 512


def test_generate_with_a_bfloat16_state_and_its_state_files(tiny_ckpt, tmp_path):
    rng = np.random.default_rng()
    rows = [{"id": f"r{i}", "tokens": rng.integers(1, V, 6).tolist(), "max_tokens": 5, "stop_tokens": []}
            for i in range(3)]
    states, metrics = tmp_path / "states", tmp_path / "m.json"
    r = run_cli(["--model", tiny_ckpt, "--backend", "torch", "--state-dtype", "bfloat16", "--input",
                 write_jsonl(tmp_path / "in.jsonl", rows), "--output", tmp_path / "out.jsonl", "--save-states", states,
                 "--metrics", metrics], tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(metrics.read_text())["engine"]["state_dtype"] == "bfloat16"
    first = {x["id"]: x for x in read_results(tmp_path / "out.jsonl")}
    assert all(x["finish_reason"] == "length" for x in first.values())
    path = first["r0"]["state_file"]
    assert read_safetensors(path)[1]["state_dtype"] == "bfloat16"
    config = read_checkpoint(tiny_ckpt)[1]
    assert load_state(path, config, "bfloat16").wkv.dtype == ml_dtypes.bfloat16

    turn2 = [{"id": "next", "state": "s", "tokens": rng.integers(1, V, 3).tolist(), "max_tokens": 4, "stop_tokens": []}]
    args = ["--model", tiny_ckpt, "--backend", "torch", "--input", write_jsonl(tmp_path / "in2.jsonl", turn2),
            "--output", tmp_path / "out2.jsonl", "--state", f"s={path}"]
    refused = run_cli(args, tmp_path)  # a float32-state model
    assert refused.returncode == 2
    line = [x for x in refused.stderr.splitlines() if "error" in x]
    assert len(line) == 1 and path in line[0]
    assert "its wkv state is bfloat16 but this model holds its state in float32" in line[0]
    ok = run_cli(args + ["--state-dtype", "bfloat16"], tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert len(read_results(tmp_path / "out2.jsonl")[0]["tokens"]) == 4


def test_serve_reports_the_state_dtype(tiny_ckpt, tmp_path):
    with running_server(["--model", str(tiny_ckpt), "--kernels", "xla", "--state-dtype", "float16", "--buckets", "1"],
                        tmp_path) as server:
        status, body = server.get("/v1/models")
        assert status == 200
        assert json.loads(body)["data"][0]["state_dtype"] == "float16"
        status, body = server.post("/v1/completions", json.dumps({"prompt": [5, 6, 7], "max_tokens": 3}).encode())
        assert status == 200, body
