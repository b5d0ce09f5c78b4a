"""rwkv7-generate with states, through the console script (torch backend, tiny model): a
two-turn conversation continued from --save-states files registered with --state, bad state
files and names, and the persistent prefix cache across processes (hits, same tokens,
corrupt files skipped)."""
from __future__ import annotations

import json
import os

import numpy as np

from rwkv7_core.state_files import load_state, save_state, zero_state
from tests.rwkv7_apps.cli_harness import read_results, run_cli, write_jsonl
from tests.shapes import ODD_CONFIG

V = 512


def _by_id(path):
    return {r["id"]: r for r in read_results(path)}


def test_two_turn_conversation_from_saved_states(tiny_ckpt, tmp_path):
    rng = np.random.default_rng()
    ids = ["plain-1", "a/b: ü?", 7]  # the second is no safe file name as it is
    prompts = [rng.integers(1, V, int(n)).tolist() for n in (5, 9, 3)]
    turn1 = [{"id": i, "tokens": p, "max_tokens": 6, "stop_tokens": []} for i, p in zip(ids, prompts)]
    del turn1[2]["stop_tokens"]  # the default stop token 0 may end it early: the state never holds it
    out1, states = tmp_path / "out1.jsonl", tmp_path / "states"
    r = run_cli(["--model", tiny_ckpt, "--backend", "torch", "--input", write_jsonl(tmp_path / "in1.jsonl", turn1),
                 "--output", out1, "--save-states", states], tmp_path)
    assert r.returncode == 0, r.stderr
    first = _by_id(out1)
    files = {i: first[i]["state_file"] for i in ids}
    assert len(set(files.values())) == 3 and all(f.startswith(str(states)) for f in files.values())
    assert sorted(p.name for p in states.iterdir()) == sorted(f.split("/")[-1] for f in files.values())
    saved = load_state(files["plain-1"], _tiny_config(tiny_ckpt))
    assert saved.tokens == 5 + first["plain-1"]["generated_tokens"]

    p2 = rng.integers(1, V, 4).tolist()
    turn2, options = [], []
    for n, (i, p) in enumerate(zip(ids, prompts)):
        turn2.append({"id": f"next-{n}", "state": f"s{n}", "tokens": p2, "max_tokens": 8, "stop_tokens": []})
        turn2.append({"id": f"one-go-{n}", "tokens": p + first[i]["tokens"] + p2, "max_tokens": 8, "stop_tokens": []})
        options += ["--state", f"s{n}={files[i]}"]
    turn2.append({"id": "unknown", "state": "nope", "tokens": p2})
    turn2.append({"id": "not-a-name", "state": 3, "tokens": p2})
    out2 = tmp_path / "out2.jsonl"
    r = run_cli(["--model", tiny_ckpt, "--backend", "torch", "--input", write_jsonl(tmp_path / "in2.jsonl", turn2),
                 "--output", out2, *options], tmp_path)
    assert r.returncode == 0, r.stderr
    second = _by_id(out2)
    for n in range(3):
        assert second[f"next-{n}"]["tokens"] == second[f"one-go-{n}"]["tokens"]
        assert len(second[f"next-{n}"]["tokens"]) == 8
    assert second["unknown"]["finish_reason"] == "error"
    assert "unknown state 'nope' (registered: s0, s1, s2)" in second["unknown"]["error"]
    assert "'state' must be a non-empty string" in second["not-a-name"]["error"]


def _tiny_config(tiny_ckpt):
    from rwkv7_core.checkpoint import read_checkpoint
    return read_checkpoint(tiny_ckpt.with_suffix(".safetensors"))[1]


def test_unusable_state_files_fail_at_once(tiny_ckpt, tmp_path):
    save_state(tmp_path / "odd.safetensors", zero_state(ODD_CONFIG), ODD_CONFIG)
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "tokens": [1, 2]}])
    r = run_cli(["--model", tiny_ckpt, "--backend", "torch", "--input", inp, "--output", tmp_path / "o.jsonl",
                 "--state", f"x={tmp_path / 'odd.safetensors'}"], tmp_path)
    assert r.returncode == 2
    assert "was made for model shape L3 C192" in r.stderr and "this model's shape is L2 C128" in r.stderr
    r = run_cli(["--model", tiny_ckpt, "--backend", "torch", "--input", inp, "--output", tmp_path / "o.jsonl",
                 "--state", f"x={tiny_ckpt}", "--state", "bad-option"], tmp_path)
    assert r.returncode == 2 and "expected NAME=FILE" in r.stderr
    r = run_cli(["--model", tiny_ckpt, "--backend", "torch", "--input", inp, "--output", tmp_path / "o.jsonl",
                 "--state", f"x={tiny_ckpt}"], tmp_path)
    assert r.returncode == 2 and "is neither a state file" in r.stderr
    assert not (tmp_path / "o.jsonl").read_text()


def test_disk_prefix_cache_across_processes(tiny_ckpt, tmp_path):
    rng = np.random.default_rng()
    system = rng.integers(1, V, 150).tolist()
    reqs = [{"id": f"q{i}", "tokens": system + rng.integers(1, V, int(rng.integers(2, 9))).tolist(),
             "max_tokens": 5, "stop_tokens": []} for i in range(5)]
    inp, cache = write_jsonl(tmp_path / "in.jsonl", reqs), tmp_path / "prefix-cache"

    def run(k):
        out, metrics = tmp_path / f"out{k}.jsonl", tmp_path / f"m{k}.json"
        r = run_cli(["--model", tiny_ckpt, "--backend", "torch", "--input", inp, "--output", out,
                     "--prefix-cache-dir", cache, "--prefix-cache-disk-mb", "64", "--metrics", metrics], tmp_path)
        assert r.returncode == 0, r.stderr
        return ({i: rec["tokens"] for i, rec in _by_id(out).items()}, json.loads(metrics.read_text()), r.stderr)

    cold, cold_m, _ = run(1)
    warm, warm_m, _ = run(2)
    assert warm == cold and len(cold) == 5
    assert cold_m["tokens"]["prefilled"] > 0 and cold_m["prefix_cache"]["misses"] >= 1
    assert warm_m["tokens"]["prefilled"] == 0 and warm_m["prefix_cache"]["hits"] == 5
    files = sorted(cache.glob("*.safetensors"))
    assert files
    for f in files:  # cut every entry short: each is skipped (and removed), never loaded
        f.write_bytes(f.read_bytes()[:-64])
    again, again_m, stderr = run(3)
    assert again == cold
    assert "prefix cache: skipped and removed" in stderr and again_m["tokens"]["prefilled"] == cold_m["tokens"]["prefilled"]
    run(4)  # entries written again; now each becomes a FIFO, which used to block the job in open() for ever
    for f in sorted(cache.glob("*.safetensors")):
        f.unlink()
        os.mkfifo(f)
    fifo, fifo_m, stderr = run(5)
    assert fifo == cold and "not a regular file" in stderr
    assert fifo_m["tokens"]["prefilled"] == cold_m["tokens"]["prefilled"]
