"""rwkv7-generate --ray with two CPU actors on the tiny model (torch backend: no compiles):
`--ray local` reproduces one process's greedy tokens; on one local cluster (one test, so
pytest-xdist never starts two), a RayReplicaSet in this process serves every member of the
scheduler interface, SIGKILL of one actor mid-run, then SIGKILL of the driver and a rerun,
each end with every id exactly once and every result equal to the request decoded alone.

Cost on 2 cores: two cluster start-ups (the `local` run's own, then the test's), about
10 s each, and five driver runs of 10-30 s."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from scheduler.replicas.ray_cluster import LOCAL_ENV
from tests.rwkv7_apps.cli_harness import (
    cli_env,
    greedy_reference,
    random_token_requests,
    read_results,
    wait_for_lines,
    write_jsonl,
)
from tests.rwkv7_apps.interface_check import exercise_interface

os.environ.update(LOCAL_ENV)  # before Ray is imported: the test's cluster stays on 127.0.0.1
ray = pytest.importorskip("ray")


def _cli(args, tmp_path) -> list[str]:
    return [sys.executable, "-m", "rwkv7_apps.generate", "--backend", "torch", *map(str, args)]


def _run(args, tmp_path) -> subprocess.CompletedProcess:
    proc = subprocess.run(_cli(args, tmp_path), capture_output=True, text=True, timeout=300, env=cli_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _start(args, tmp_path) -> subprocess.Popen:
    return subprocess.Popen(_cli(args, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(tmp_path))


def _check(out, reqs, model) -> list[dict]:
    results = read_results(out)
    ids = [r["id"] for r in results]
    assert sorted(ids) == sorted(r["id"] for r in reqs) and len(set(ids)) == len(ids)
    by_id = {r["id"]: r for r in results}
    for r in reqs:
        assert by_id[r["id"]]["tokens"] == greedy_reference(model, r["tokens"], r["max_tokens"], as_torch=True)
    return results


def _requests(seed: int, n: int, max_tokens=(6, 12)):
    return random_token_requests(np.random.default_rng(seed), n, 512, lengths=(2, 5, 9), max_tokens=max_tokens)


@pytest.fixture(scope="module")
def model(tiny_ckpt):
    import rwkv_torch_ref
    return rwkv_torch_ref.load(tiny_ckpt)


@pytest.fixture
def cluster():
    """A local 2-CPU Ray cluster; yields its address (the CLI's --ray)."""
    from scheduler.replicas.ray_cluster import connect

    connect("local")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def test_ray_local_matches_one_process(tiny_ckpt, model, tmp_path):
    reqs = _requests(11, 16)
    inp, out, metrics = write_jsonl(tmp_path / "in.jsonl", reqs), tmp_path / "out.jsonl", tmp_path / "m.json"
    _run(["--model", tiny_ckpt, "--input", inp, "--output", out, "--max-batch", 4, "--ray", "local",
          "--data-parallel", 2, "--metrics", metrics], tmp_path)
    _check(out, reqs, model)
    replicas = json.loads(metrics.read_text())["replicas"]
    assert len(replicas) == 2 and all(r["requests"] > 0 and r["failed"] is None for r in replicas)


@pytest.mark.single_stack
def test_killed_actor_and_killed_driver_lose_nothing(cluster, tiny_ckpt, model, tmp_path):
    _the_actors_serve_the_whole_scheduler_interface(cluster, tiny_ckpt)
    _a_killed_actor_has_its_requests_rerun(cluster, tiny_ckpt, model, tmp_path / "actor")
    _driver_sigkill_then_rerun_resumes(cluster, tiny_ckpt, model, tmp_path / "driver")
    _a_model_that_fails_to_load_is_a_clear_error(cluster, tmp_path / "bad")


def _the_actors_serve_the_whole_scheduler_interface(cluster, tiny_ckpt):
    import functools

    from rwkv7_apps.engines import load_node_engine
    from scheduler import SchedulerConfig
    from scheduler.replicas.ray_cluster import ray_replica_set

    load = functools.partial(load_node_engine, "torch", str(tiny_ckpt), None, "float32", "torch")
    rset = ray_replica_set(cluster, "2", load, SchedulerConfig(max_batch=4))
    try:
        exercise_interface(rset)
    finally:
        for replica in rset.replicas:  # their CPUs go back to the cluster for the CLI runs
            ray.kill(replica.scheduler.actor)


def _a_model_that_fails_to_load_is_a_clear_error(cluster, tmp_path):
    tmp_path.mkdir()
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"not a checkpoint")
    inp = write_jsonl(tmp_path / "in.jsonl", _requests(14, 2))
    proc = subprocess.run(_cli(["--model", bad, "--input", inp, "--output", tmp_path / "out.jsonl", "--ray", cluster,
                                "--data-parallel", 2], tmp_path), capture_output=True, text=True, timeout=180,
                          env=cli_env(tmp_path))
    assert proc.returncode == 2 and "an actor could not load the model" in proc.stderr, proc.stderr[-3000:]


def _a_killed_actor_has_its_requests_rerun(cluster, tiny_ckpt, model, tmp_path):
    tmp_path.mkdir()
    reqs = _requests(12, 24, max_tokens=(16, 24))
    inp, out, metrics = write_jsonl(tmp_path / "in.jsonl", reqs), tmp_path / "out.jsonl", tmp_path / "m.json"
    proc = _start(["--model", tiny_ckpt, "--input", inp, "--output", out, "--max-batch", 2, "--ray", cluster,
                   "--data-parallel", 2, "--metrics", metrics], tmp_path)
    wait_for_lines(out, 2, proc)
    actor = ray.get_actor(f"rwkv7-generate-{proc.pid}-1", namespace="rwkv7")
    os.kill(ray.get(actor.pid.remote()), signal.SIGKILL)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    assert "replica 1" in stderr and "taken out: its actor died" in stderr
    _check(out, reqs, model)
    replicas = json.loads(metrics.read_text())["replicas"]
    assert replicas[0]["failed"] is None and "actor died" in replicas[1]["failed"]


def _driver_sigkill_then_rerun_resumes(cluster, tiny_ckpt, model, tmp_path):
    tmp_path.mkdir()
    reqs = _requests(13, 20, max_tokens=(16, 24))
    inp, out = write_jsonl(tmp_path / "in.jsonl", reqs), tmp_path / "out.jsonl"
    args = ["--model", tiny_ckpt, "--input", inp, "--output", out, "--max-batch", 2, "--ray", cluster,
            "--data-parallel", 2]
    proc = _start(args, tmp_path)
    wait_for_lines(out, 3, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    before = read_results(out)
    assert 3 <= len(before) < len(reqs)
    rerun = _run(args, tmp_path)  # the dead driver's actors are reaped by Ray, freeing the CPUs
    assert f"resuming: {len(before)} results" in rerun.stderr
    results = _check(out, reqs, model)
    assert results[:len(before)] == before
