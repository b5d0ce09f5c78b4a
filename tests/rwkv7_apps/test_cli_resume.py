"""rwkv7-generate under interruption (torch backend, tiny model): SIGKILL midway then rerun,
and SIGINT's clean stop then rerun. Afterwards every id is present exactly once, no line is
torn, results written before the interruption are unchanged, and every result equals the
request decoded alone."""
from __future__ import annotations

import json
import signal

import numpy as np

from tests.rwkv7_apps.cli_harness import (
    greedy_reference,
    random_token_requests,
    read_results,
    run_cli,
    start_cli,
    wait_for_lines,
    write_jsonl,
)

N_REQUESTS = 24


def _check_complete(results, reqs, model) -> None:
    ids = [r["id"] for r in results]
    assert sorted(ids) == sorted(r["id"] for r in reqs) and len(set(ids)) == len(ids)
    by_id = {r["id"]: r for r in results}
    for r in reqs:
        assert by_id[r["id"]]["tokens"] == greedy_reference(model, r["tokens"], r["max_tokens"], as_torch=True)


def _requests(seed: int):
    rng = np.random.default_rng(seed)
    return random_token_requests(rng, N_REQUESTS, 512, lengths=(2, 5, 9), max_tokens=(8, 16))


def test_sigkill_midway_then_rerun(tiny_ckpt, tmp_path):
    import rwkv_torch_ref

    reqs = _requests(31)
    inp = write_jsonl(tmp_path / "in.jsonl", reqs)
    out = tmp_path / "out.jsonl"
    args = ["--model", tiny_ckpt, "--backend", "torch", "--input", inp, "--output", out, "--max-batch", 2]
    proc = start_cli(args, tmp_path)
    wait_for_lines(out, 3, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    before = read_results(out)
    assert 3 <= len(before) < N_REQUESTS  # really killed midway
    # a write torn by the kill: the rerun must cut it off and redo that request
    torn = json.dumps({"id": reqs[-1]["id"], "tokens": [1, 2, 3], "finish_reason": "length"})[:25]
    with open(out, "a") as f:
        f.write(torn)
    rerun = run_cli(args, tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "torn last line" in rerun.stderr and f"resuming: {len(before)} results" in rerun.stderr
    results = read_results(out)
    assert results[:len(before)] == before
    _check_complete(results, reqs, rwkv_torch_ref.load(tiny_ckpt))


def test_sigint_stops_cleanly_then_rerun_completes(tmp_path, monkeypatch):
    import rwkv_torch_ref
    from rwkv7_apps.engines import random_model_path

    reqs = _requests(77)
    inp = write_jsonl(tmp_path / "in.jsonl", reqs)
    out = tmp_path / "out.jsonl"
    args = ["--random-model", "tiny", "--backend", "torch", "--input", inp, "--output", out, "--max-batch", 2]
    proc = start_cli(args, tmp_path)
    wait_for_lines(out, 3, proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
    assert "Traceback" not in stderr and "rerun the same command" in stderr
    before = read_results(out)
    assert 3 <= len(before) < N_REQUESTS
    assert all(r["finish_reason"] in ("length", "stop") for r in before)  # in-flight ones finished
    rerun = run_cli(args, tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    results = read_results(out)
    assert results[:len(before)] == before
    metrics_line = [x for x in rerun.stdout.splitlines() if "requests ok / failed" in x][0]
    assert f"{N_REQUESTS - len(before)} / 0" in metrics_line and f"({len(before)} already done)" in metrics_line
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cached = random_model_path("tiny")  # written by the first run, reused by the rerun
    assert cached.parent == tmp_path / "cache" / "rwkv7" and len(list(cached.parent.iterdir())) == 1
    _check_complete(results, reqs, rwkv_torch_ref.load(cached))


def test_a_dead_prefill_thread_exits_1_in_one_line_then_rerun_completes(tiny_ckpt, tmp_path, monkeypatch):
    """The prefill thread dies after two prompts (an injected BaseException, as a crash past
    every handler): the job says so in one line and exits 1 instead of hanging, what it
    finished is written, and a rerun does exactly the rest."""
    import rwkv_torch_ref

    reqs = _requests(int(np.random.default_rng().integers(1000)))[:8]
    inp = write_jsonl(tmp_path / "in.jsonl", reqs)
    out = tmp_path / "out.jsonl"
    args = ["--model", tiny_ckpt, "--backend", "torch", "--input", inp, "--output", out, "--max-batch", 2,
            "--prefill", "serial"]
    monkeypatch.setenv("RWKV7_REPLICA_FAULT", "0:prefill:2")
    died = run_cli(args, tmp_path, timeout=120)
    monkeypatch.delenv("RWKV7_REPLICA_FAULT")
    before = read_results(out)
    assert died.returncode == 1, died.stderr[-3000:]
    assert "Traceback" not in died.stderr
    assert [line for line in died.stderr.splitlines() if line.startswith("rwkv7-generate:")] == [
        "rwkv7-generate: the prefill thread died: InjectedThreadDeath: injected prefill thread death after 2 "
        f"prefill calls: {len(before)} results written this run; rerun the same command to do the rest"]
    assert len(before) <= 2
    rerun = run_cli(args, tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    results = read_results(out)
    assert results[:len(before)] == before
    _check_complete(results, reqs, rwkv_torch_ref.load(tiny_ckpt))
