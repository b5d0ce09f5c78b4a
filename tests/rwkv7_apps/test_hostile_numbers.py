"""Integer request fields past what an engine holds (int32 per row): max_tokens and top_k at
2**31, 2**63, 10**30 or negative fail alone with a message naming the field — in the
scheduler, on a batch-job line and over HTTP — while good requests beside them get exactly
their own result (issue 30, items 1-2: such a top_k used to kill the prefill thread). So do
a max_tokens over ``--max-tokens-limit`` and a seed outside [0, 2**64 - 1]; 64-bit seeds run."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rwkv7_core.sampling import DEVICE_INT_MAX
from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig, generate
from tests.rwkv7_apps.cli_harness import greedy_reference, read_results, run_cli, write_jsonl
from tests.support.scheduler_engines import FakeEngine

HOSTILE = [2**31, 2**63, 10**30, -1]
LIMIT = 40  # --max-tokens-limit of these tests
OVER_LIMITS = [("max_tokens", LIMIT + 1, f"{LIMIT + 1} exceeds the limit {LIMIT} (--max-tokens-limit)"),
               ("seed", 2**64, "seed"), ("seed", -1, "seed"), ("seed", 10**30, "seed")]


def test_the_scheduler_fails_each_hostile_request_alone():
    rng = np.random.default_rng()
    good = [Request(f"good{i}", rng.integers(1, 64, int(rng.integers(2, 9))).tolist(),
                    SamplingParams(max_tokens=int(rng.integers(3, 12)), stop_tokens=[])) for i in range(3)]
    bad = [Request(f"{field}={value}", [1, 2], SamplingParams(stop_tokens=[], **{field: value}))
           for field in ("max_tokens", "top_k") for value in HOSTILE]
    over = [Request(f"{field}={value}", [1, 2], SamplingParams(stop_tokens=[], **{field: value}))
            for field, value, _ in OVER_LIMITS]
    good.append(Request("seed=2**63+", [3, 4], SamplingParams(max_tokens=LIMIT, temperature=1.0, stop_tokens=[],
                                                               seed=2**63 + int(rng.integers(2**62)))))
    mixed = bad + over
    for i, r in enumerate(good):  # good requests between the bad ones
        mixed.insert(3 * i + 1, r)
    sched = Scheduler(FakeEngine(), SchedulerConfig(max_batch=4, max_tokens_limit=LIMIT))
    for r in mixed:
        sched.add(r)
    sched.run()
    for r in bad:
        out = sched.results[r.id]
        field = r.id.split("=")[0]
        assert out.finish_reason == "error" and field in out.error and str(DEVICE_INT_MAX) in out.error, out
    for r, (field, _, why) in zip(over, OVER_LIMITS):
        out = sched.results[r.id]
        assert out.finish_reason == "error" and f"SamplingParams.{field}=" in out.error and why in out.error, out
    for r in good:
        assert sched.results[r.id].tokens == generate(FakeEngine(), [r])[0].tokens


def test_the_largest_top_k_keeps_every_token():
    rng = np.random.default_rng()
    prompt, seed = rng.integers(1, 64, 5).tolist(), int(rng.integers(2**32))
    draws = [generate(FakeEngine(), [Request("r", prompt, SamplingParams(max_tokens=12, temperature=1.0,
                                                                          top_k=k, seed=seed, stop_tokens=[]))])
             [0].tokens for k in (0, DEVICE_INT_MAX)]
    assert draws[0] == draws[1] and len(draws[0]) == 12


def test_batch_job_writes_an_error_record_per_hostile_line(tiny_ckpt, tmp_path):
    rwkv_jax = pytest.importorskip("rwkv_jax")
    rng = np.random.default_rng()
    good = [{"id": f"good{i}", "tokens": rng.integers(1, 512, int(rng.integers(2, 7))).tolist(),
             "max_tokens": int(rng.integers(2, 6)), "temperature": 0} for i in range(3)]
    good[0]["seed"] = 2**64 - 1 - int(rng.integers(2**32))  # a 64-bit seed (greedy: the tokens do not change)
    bad = [{"id": f"{field}={value}", "tokens": [1, 2], field: value}
           for field in ("max_tokens", "top_k") for value in HOSTILE]
    bad += [{"id": f"{field}={value}", "tokens": [1, 2], field: value} for field, value, _ in OVER_LIMITS]
    bad.append({"id": "prompt=33", "tokens": rng.integers(1, 512, 33).tolist()})
    out = tmp_path / "out.jsonl"
    proc = run_cli(["--model", tiny_ckpt, "--input", write_jsonl(tmp_path / "in.jsonl", bad[:4] + good + bad[4:]),
                    "--output", out, "--max-batch", 4, "--prefill", "serial", "--max-tokens", 8,
                    "--max-tokens-limit", LIMIT, "--max-prompt-tokens", 32], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {r["id"]: r for r in read_results(out)}
    assert set(results) == {r["id"] for r in good + bad}
    for r in bad:
        record = results[r["id"]]
        assert record["finish_reason"] == "error" and r["id"].split("=")[0] in record["error"], record
    for field, value, why in OVER_LIMITS:
        assert why in results[f"{field}={value}"]["error"]
    assert "33 prompt tokens exceed the limit 32 (--max-prompt-tokens)" in results["prompt=33"]["error"]
    model = rwkv_jax.load(tiny_ckpt, dtype="float32", kernels="xla")
    for r in good:
        assert results[r["id"]]["tokens"] == greedy_reference(model, r["tokens"], r["max_tokens"])


def test_server_answers_400_naming_the_field_and_keeps_serving(tiny_ckpt):
    openai = pytest.importorskip("openai")
    pytest.importorskip("torch")
    import urllib.request

    from rwkv7_apps.engines import load_engine
    from rwkv7_apps.serve.cli import build_app
    from rwkv7_apps.serve.job import Limits
    from tests.rwkv7_apps.serve_harness import in_process_server

    engine = load_engine("torch", tiny_ckpt, kernels="torch")
    sched = Scheduler(engine, SchedulerConfig(max_batch=4))
    app, service = build_app(sched, "m", {"max_tokens": 8}, Limits(64, 16, LIMIT), lambda: True)
    rng = np.random.default_rng()
    prompt = rng.integers(1, 512, 6).tolist()
    with in_process_server(app, service) as url:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        want = generate(engine, [Request("alone", prompt, SamplingParams(max_tokens=5, stop_tokens=[]))])[0].tokens
        for field in ("max_tokens", "top_k", "max_completion_tokens"):
            for value in HOSTILE:
                with pytest.raises(openai.BadRequestError) as e:
                    if field == "max_completion_tokens":
                        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                       max_completion_tokens=value)
                    else:
                        client.completions.create(model="m", prompt=[1, 2], extra_body={field: value})
                assert field in json.dumps(e.value.body), e.value.body
        for field, value, why in OVER_LIMITS:
            with pytest.raises(openai.BadRequestError) as e:
                client.completions.create(model="m", prompt=[1, 2], extra_body={field: value})
            assert field in json.dumps(e.value.body) and (field == "seed" or why in e.value.body["message"]), e.value.body
        assert client.models.list().data[0].model_extra["max_tokens_limit"] == LIMIT
        seeded = client.completions.create(model="m", prompt=prompt, max_tokens=5, temperature=1.0, seed=2**40,
                                           extra_body={"stop_token_ids": [], "return_token_ids": True})
        assert seeded.choices[0].model_extra["token_ids"] == generate(engine, [Request(
            "s", prompt, SamplingParams(max_tokens=5, temperature=1.0, seed=2**40, stop_tokens=[]))])[0].tokens
        got = client.completions.create(model="m", prompt=prompt, max_tokens=5, temperature=0,
                                        extra_body={"stop_token_ids": [], "return_token_ids": True})
        assert got.choices[0].model_extra["token_ids"] == want
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health") as health:
            assert health.status == 200
