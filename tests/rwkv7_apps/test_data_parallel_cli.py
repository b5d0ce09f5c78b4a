"""rwkv7-generate --data-parallel in a subprocess with two forced XLA CPU devices (set before
jax is imported): the same greedy tokens as one device decoding each request alone, both
replicas serve, every id exactly once, and ``--prefill auto`` flattens prompts (varlen calls
in the metrics and the summary: the replicas keep the engine's capabilities); an injected
engine fault on replica 1 moves its requests to replica 0 with nothing lost or duplicated.
The torch backend (no varlen capability: auto runs serial calls) runs one replica per thread
on the CPU."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.rwkv7_apps.cli_harness import cli_env, greedy_reference, random_token_requests, read_results, write_jsonl

TWO_DEVICES = "--xla_force_host_platform_device_count=2"


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    """One XDG cache for the module: the second JAX run reuses the first one's compiles."""
    return tmp_path_factory.mktemp("dp-cache")


def run_cli(args, tmp_path, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rwkv7_apps.generate", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env={**cli_env(tmp_path), **(env or {})})


def _run(tmp_path, cache_home, reqs, extra, env=None):
    inp = write_jsonl(tmp_path / "in.jsonl", reqs)
    out, metrics = tmp_path / "out.jsonl", tmp_path / "metrics.json"
    proc = run_cli(["--input", inp, "--output", out, "--max-batch", 4, "--buckets", 4, "--metrics", metrics,
                    *extra], tmp_path, env={"XLA_FLAGS": TWO_DEVICES, "XDG_CACHE_HOME": str(cache_home), **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_results(out), json.loads(metrics.read_text()), proc


def _check(results, reqs, model, as_torch=False) -> None:
    ids = [r["id"] for r in results]
    assert sorted(ids) == sorted(r["id"] for r in reqs) and len(set(ids)) == len(ids)
    by_id = {r["id"]: r for r in results}
    for r in reqs:
        assert by_id[r["id"]]["tokens"] == greedy_reference(model, r["tokens"], r["max_tokens"], as_torch=as_torch)


def _requests(seed: int, n: int = 16):
    return random_token_requests(np.random.default_rng(seed), n, 512, lengths=(1, 2, 3), max_tokens=(6, 12))


@pytest.mark.parametrize("fault", [None, "1:engine:4"])
def test_two_jax_devices_match_one_and_survive_a_fault(tiny_ckpt, tmp_path, cache_home, fault):
    import rwkv_jax

    reqs = _requests(5 if fault is None else 6)
    results, metrics, proc = _run(tmp_path, cache_home, reqs, ["--model", tiny_ckpt, "--data-parallel", 2,
                                                               "--prefill", "auto"],
                                  env={"RWKV7_REPLICA_FAULT": fault} if fault else None)
    _check(results, reqs, rwkv_jax.load(tiny_ckpt))
    assert metrics["prefill_calls"].get("varlen", 0) > 0, metrics["prefill_calls"]
    assert re.search(r"prefill calls .*varlen [1-9]", proc.stdout), proc.stdout
    replicas = metrics["replicas"]
    assert [r["device"] for r in replicas] == ["cpu:0", "cpu:1"]
    assert sum(r["requests"] for r in replicas) == len(reqs) == metrics["requests"]["ok"]
    if fault is None:
        assert all(r["requests"] > 0 and r["failed"] is None for r in replicas)
    else:
        assert replicas[0]["failed"] is None and re.search(r"raised [3-9] times in a row", replicas[1]["failed"])
        assert "replica 1 (cpu:1) taken out" in proc.stderr


def test_torch_replicas_one_thread_each(tiny_ckpt, tmp_path, cache_home):
    import rwkv_torch_ref

    reqs = _requests(7)
    results, metrics, _ = _run(tmp_path, cache_home, reqs, ["--model", tiny_ckpt, "--backend", "torch",
                                                            "--data-parallel", 2])
    _check(results, reqs, rwkv_torch_ref.load(tiny_ckpt), as_torch=True)
    assert [r["device"] for r in metrics["replicas"]] == ["cpu", "cpu"]
    assert all(r["requests"] > 0 for r in metrics["replicas"])
    assert set(metrics["prefill_calls"]) == {"serial"}


def test_bad_data_parallel_values_are_refused(tiny_ckpt, tmp_path, cache_home):
    write_jsonl(tmp_path / "in.jsonl", _requests(8, n=1))
    for value, why in (("0", "expected a positive integer"), ("two", "expected a positive integer")):
        proc = run_cli(["--model", tiny_ckpt, "--input", tmp_path / "in.jsonl", "--output", tmp_path / "o.jsonl",
                        "--data-parallel", value], tmp_path)
        assert proc.returncode == 2 and why in proc.stderr and "Traceback" not in proc.stderr


PINNING_CHECK = """
import sys, jax, numpy as np, rwkv_jax
from rwkv_jax.engine import JaxEngine
from rwkv7_core.sampling import SamplingParams
drawn = []
for device in (0, 1):
    engine = JaxEngine(rwkv_jax.load(sys.argv[1], device=device))
    want = {jax.local_devices()[device]}
    engine.resize([], 2)
    row = engine.prefill(np.array([3]))
    engine.insert(1, row, SamplingParams())
    out = engine.step(np.array([0, engine.sample(row, SamplingParams())]), np.array([0, 1]))
    leaves = jax.tree.leaves((engine.model.params, engine.slots, row, engine.from_host(engine.to_host(row))))
    assert all(leaf.devices() == want for leaf in leaves), device
    drawn.append(out.tolist())
assert drawn[0] == drawn[1], drawn
print("pinned")
"""


def test_jax_device_option_keeps_weights_batch_and_rows_on_that_device(tiny_ckpt, tmp_path):
    proc = subprocess.run([sys.executable, "-c", PINNING_CHECK, str(tiny_ckpt)], capture_output=True, text=True,
                          timeout=300, env={**cli_env(tmp_path), "XLA_FLAGS": TWO_DEVICES})
    assert proc.returncode == 0 and "pinned" in proc.stdout, proc.stderr[-3000:]
