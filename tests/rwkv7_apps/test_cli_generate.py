"""rwkv7-generate end to end through the console script (JAX backend, tiny model): every id
exactly once, greedy outputs equal to each request decoded alone, per-request overrides,
error records for bad lines, metrics and plot; plus fail-fast checks on bad paths."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.rwkv7_apps.cli_harness import greedy_reference, random_token_requests, read_results, run_cli, write_jsonl


# ----------------------------------------------------------------------------- tests
def test_generate_jax_end_to_end(tiny_ckpt, tmp_path):
    import rwkv_jax

    ckpt = tiny_ckpt.with_suffix(".safetensors")
    rng = np.random.default_rng(2024)
    reqs = random_token_requests(rng, 14, 512, lengths=(4, 8), max_tokens=(1, 5, 9))  # few compiles
    for r in reqs:
        r["temperature"] = 0  # overrides the sampled default below
    model = rwkv_jax.load(ckpt, dtype="float32", kernels="xla")
    want = {r["id"]: greedy_reference(model, r["tokens"], r["max_tokens"]) for r in reqs}
    # per-request overrides: stop token = the request's third greedy token; no max_tokens
    # (the default --max-tokens 7 applies); sampled (default temperature) with a seed.
    stop_req = next(r for r in reqs if len(want[r["id"]]) >= 4 and want[r["id"]][2] not in want[r["id"]][:2])
    stop_req["stop_tokens"] = [want[stop_req["id"]][2]]
    default_len = reqs[0]
    del default_len["max_tokens"]
    want[default_len["id"]] = greedy_reference(model, default_len["tokens"], 7)
    sampled = {"id": "sampled", "tokens": reqs[1]["tokens"], "max_tokens": 9, "seed": 5}
    bad = ["{this is not json",
           json.dumps({"id": reqs[2]["id"], "tokens": [1, 2]}),
           json.dumps({"id": "text", "prompt": "Hello world"}),
           json.dumps({"id": "bad-top-p", "tokens": [1], "top_p": 1.5}),
           json.dumps({"id": "bad-field", "tokens": [1], "nucleus": 0.5}),
           json.dumps({"id": "bad-token", "tokens": [1, 512]})]
    rows = reqs[:5] + bad[:3] + reqs[5:10] + [sampled] + bad[3:] + reqs[10:]
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    out, metrics, plot = tmp_path / "out.jsonl", tmp_path / "m.json", tmp_path / "run.png"
    proc = run_cli(["--model", ckpt, "--input", inp, "--output", out, "--max-batch", 2, "--max-tokens", 7,
                    "--temperature", 0.8, "--top-k", 40, "--metrics", metrics, "--plot", plot], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "generate" in proc.stderr and "requests ok / failed" in proc.stdout

    results = read_results(out)
    ids = [r["id"] for r in results]
    assert len(results) == len(rows)
    assert sorted(map(str, ids)) == sorted(map(str, [r["id"] for r in reqs] + ["sampled", None, reqs[2]["id"],
                                                                                "text", "bad-top-p", "bad-field",
                                                                                "bad-token"]))
    ok = {r["id"]: r for r in results if r["finish_reason"] != "error"}
    errors = [r for r in results if r["finish_reason"] == "error"]
    assert set(ok) == {r["id"] for r in reqs} | {"sampled"}
    for r in reqs:
        got = ok[r["id"]]
        expect = want[r["id"]]
        if r is stop_req:
            assert got["tokens"] == expect[:2] and got["finish_reason"] == "stop"
        else:
            assert got["tokens"] == expect, r["id"]
            assert got["finish_reason"] == ("length" if len(expect) == r.get("max_tokens", 7) else "stop")
        assert got["prompt_tokens"] == len(r["tokens"]) and got["generated_tokens"] == len(got["tokens"])
        assert "text" not in got  # vocabulary 512: no tokenizer
    assert ok["sampled"]["tokens"] != greedy_reference(model, sampled["tokens"], 9)  # default temperature 0.8

    by_msg = {r["error"].split(":")[0]: r for r in errors}
    line_of = {json.dumps(x) if not isinstance(x, str) else x: i + 1 for i, x in enumerate(rows)}
    assert {f"line {line_of[b]}" for b in bad} == set(by_msg)
    assert "malformed JSON" in by_msg[f"line {line_of[bad[0]]}"]["error"]
    dup = by_msg[f"line {line_of[bad[1]]}"]
    assert "duplicate id" in dup["error"] and dup["line"] == line_of[bad[1]]
    assert "World tokenizer" in by_msg[f"line {line_of[bad[2]]}"]["error"]
    assert "top_p" in by_msg[f"line {line_of[bad[3]]}"]["error"]
    assert "nucleus" in by_msg[f"line {line_of[bad[4]]}"]["error"]
    assert "512" in by_msg[f"line {line_of[bad[5]]}"]["error"]

    m = json.loads(metrics.read_text())
    # auto on the CPU: the native kernels once their self-check passes (every test host has a C++ compiler)
    assert m["engine"] == {"kernels": "native", "dtype": "float32", "state_dtype": "float32"}
    assert re.search(r"engine kernels / dtype +native / float32", proc.stdout), proc.stdout
    assert m["requests"] == {"total": len(rows), "ok": len(ok), "failed": len(bad), "skipped_already_done": 0}
    assert m["tokens"]["generated"] == sum(r["generated_tokens"] for r in results)
    assert m["tokens"]["prompt"] == sum(r["prompt_tokens"] for r in ok.values())
    for key in ("prefill_tok_s", "prefill_share", "wall_time_s"):
        assert m[key] > 0
    assert 0 < m["decode_tok_s"]["average"] <= m["decode_tok_s"]["peak"]
    for key in ("ttft_s", "inter_token_latency_s"):
        assert 0 < m[key]["p50"] <= m[key]["p99"]
    assert {e["bucket"] for e in m["bucket_timeline"]} <= {1, 2} and m["bucket_timeline"]
    assert m["compile_events"] and m["prefix_cache"]["hit_rate"] is None
    # compiled ahead: the decode thread waited for no compile but the first bucket's (when it
    # was not ready by the first step); every later switch found its executables ready
    first = m["bucket_switches"][0]["to_bucket"]
    waited = [e for e in m["compile_events"] if e["thread"] == "decode"]
    assert all(re.fullmatch(rf"\w+:{first}( first run)?", e["what"]) for e in waited), waited
    assert np.isclose(sum(m["compile_seconds_by_thread"].values()), m["compile_seconds"])
    own = sum(e["seconds"] for e in waited)  # and the time it blocked on the compile thread's, at the first switch
    assert own - 1e-9 <= m["compile_seconds_waited"] <= own + m["bucket_switches"][0]["compile_wait"] + 1e-9
    assert m["compile_ahead_failures"] == 0 and m["kept_steps"] >= 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    again = run_cli(["--model", ckpt, "--input", inp, "--output", out], tmp_path)  # all done: no-op
    assert again.returncode == 0 and f"skipping {len(rows)} input lines" in again.stderr
    assert read_results(out) == results


@pytest.mark.parametrize("case", ["model", "input", "output-dir", "metrics-dir", "kernels"])
def test_bad_paths_fail_at_once(case, tiny_ckpt, tmp_path, capsys):
    from rwkv7_apps.generate.cli import main

    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "tokens": [1]}])
    args = {"--model": str(tiny_ckpt), "--input": str(inp), "--output": str(tmp_path / "out.jsonl")}
    extra = []
    missing = str(tmp_path / "nowhere" / "x")
    if case == "model":
        args["--model"] = str(tmp_path / "missing.pth")
    elif case == "input":
        args["--input"] = missing
    elif case == "output-dir":
        args["--output"] = missing
    elif case == "metrics-dir":
        extra = ["--metrics", missing]
    else:
        extra = ["--backend", "torch", "--kernels", "pallas"]
    with pytest.raises(SystemExit) as exit_info:
        main([x for kv in args.items() for x in kv] + extra)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    flag = {"model": "--model", "input": "--input", "output-dir": "--output", "metrics-dir": "--metrics",
            "kernels": "--kernels"}[case]
    assert flag in err and ("no such file" in err or "does not exist" in err or "not available" in err)
    assert not (tmp_path / "out.jsonl").exists()


def test_unloadable_model_fails_with_a_message(tmp_path):
    bad = tmp_path / "garbage.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "tokens": [1]}])
    proc = run_cli(["--model", bad, "--input", inp, "--output", tmp_path / "o.jsonl"], tmp_path, timeout=120)
    assert proc.returncode == 2 and "cannot load model" in proc.stderr and "Traceback" not in proc.stderr
