"""rwkv7-serve on the tiny random model (token-id prompts), driven by the official openai
client: batch invariance over HTTP, seeded sampling, n forks, echo/logprobs scoring,
disconnects, bad input and limits. One server for the module."""
from __future__ import annotations

import asyncio
import http.client
import json
import time

import numpy as np
import pytest

from rwkv7_core.sampling import MAX_TOKENS_LIMIT

openai = pytest.importorskip("openai")

from tests.rwkv7_apps.serve_harness import running_server  # noqa: E402

MAX_WAITING = 40
MODEL = "random-tiny"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve_tiny")
    # One prompt per prefill call, so only the decode batch differs from a request run alone.
    with running_server(["--random-model", "tiny", "--prefill", "serial", "--max-batch", "32",
                         "--max-waiting", MAX_WAITING,
                         "--max-prompt-tokens", 64,
                         "--max-body-bytes", 20000, "--seed", 3], tmp) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _tiny_vocab() -> int:
    from rwkv7_core.config import named_config
    return named_config("tiny").vocab_size


def _ids(choice) -> list[int]:
    return choice.model_extra["token_ids"]


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert server.get("/health") == (200, json.dumps({"status": "ok"}, separators=(",", ":")))


def test_concurrent_streams_equal_each_alone(client):
    """24 greedy streams of different prompt lengths, run together in buckets up to 32, give
    each the tokens it gets alone (batch invariance over HTTP) up to float rounding: a row's
    float32 logits differ from a lone row's by ~5e-6 (batch-dependent summation order), so a
    stream may diverge only where the lone run's two best logits nearly tie."""
    rng = np.random.default_rng()
    vocab = _tiny_vocab()
    prompts = [rng.integers(1, vocab, int(n)).tolist() for n in rng.integers(1, 40, 24)]
    lengths = rng.integers(2, 10, 24).tolist()
    common = dict(model=MODEL, temperature=0, extra_body={"return_token_ids": True, "stop_token_ids": []})
    alone = []
    for p, m in zip(prompts, lengths):
        choice = client.completions.create(prompt=p, max_tokens=m, logprobs=2, **common).choices[0]
        gaps = [abs(a - b) for a, b in (list(top.values()) for top in choice.logprobs.top_logprobs)]
        alone.append((_ids(choice), gaps))

    async def together():
        aclient = openai.AsyncOpenAI(base_url=client.base_url, api_key="unused", max_retries=0)

        async def one(prompt, max_tokens):
            ids, text_chunks = [], 0
            stream = await aclient.completions.create(prompt=prompt, max_tokens=max_tokens, stream=True, **common)
            async for chunk in stream:
                if chunk.choices:
                    ids += chunk.choices[0].model_extra["token_ids"]
                    text_chunks += 1
            return ids, text_chunks

        try:
            return await asyncio.gather(*(one(p, m) for p, m in zip(prompts, lengths)))
        finally:
            await aclient.close()

    streamed = asyncio.run(together())
    for (ids, chunks), (expected, gaps), m in zip(streamed, alone, lengths):
        assert len(expected) == len(ids) == m
        first = next((i for i, (a, b) in enumerate(zip(ids, expected)) if a != b), None)
        assert first is None or gaps[first] < 1e-4, (ids, expected, gaps)
        assert chunks >= m  # one chunk per token at least: tokens are flushed as drawn


def test_seeded_sampling_reproducible_and_n_forks_equal_seed_alone(client):
    prompt = np.random.default_rng().integers(1, _tiny_vocab(), 9).tolist()
    common = dict(model=MODEL, prompt=prompt, max_tokens=6, temperature=1.0, top_p=0.95,
                  extra_body={"return_token_ids": True, "stop_token_ids": []})
    seed = int(np.random.default_rng().integers(2**31))
    forked = client.completions.create(n=3, seed=seed, **common)
    assert [c.index for c in forked.choices] == [0, 1, 2]
    runs = [_ids(c) for c in forked.choices]
    assert len({tuple(r) for r in runs}) == 3, runs  # three distinct continuations
    for i, ids in enumerate(runs):  # choice i draws with seed + i, and equals that seed alone
        assert _ids(client.completions.create(seed=seed + i, **common).choices[0]) == ids
    again = client.completions.create(n=3, seed=seed, **common)
    assert [_ids(c) for c in again.choices] == runs
    assert forked.usage.prompt_tokens == len(prompt) and forked.usage.completion_tokens == 18


def test_echo_logprobs_score_the_prompt_with_the_models_own_logits(server, client):
    """max_tokens=0, echo, logprobs=k: the prompt's token logprobs equal log_softmax of the
    model's full-output logits (torch reference on the same checkpoint)."""
    torch = pytest.importorskip("torch")
    import rwkv_torch_ref

    prompt = np.random.default_rng().integers(1, _tiny_vocab(), 37).tolist()
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=3)
    lp = out.choices[0].logprobs
    assert lp.tokens == [f"token_id:{t}" for t in prompt]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    model = rwkv_torch_ref.load(server.cache / "rwkv7" / "random-tiny-seed0.safetensors", kernels="torch")
    logits, _ = model.forward(np.array([prompt]), model.init_state(1), full_output=True)
    ref = torch.log_softmax(logits[0].double(), dim=-1).numpy()
    expected = ref[np.arange(len(prompt) - 1), prompt[1:]]
    np.testing.assert_allclose(lp.token_logprobs[1:], expected, atol=2e-3, rtol=0)
    for t, top in enumerate(lp.top_logprobs[1:]):
        best = np.argsort(-ref[t])[:3]
        want = {f"token_id:{b}": ref[t, b] for b in best}
        assert set(want) <= set(top)  # the top 3 (plus the prompt's own token)
        for k, v in want.items():
            assert abs(top[k] - v) < 2e-3
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 0


def test_generated_logprobs_match_the_drawn_tokens(client):
    prompt = np.random.default_rng().integers(1, _tiny_vocab(), 5).tolist()
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, logprobs=2, temperature=0,
                                    extra_body={"return_token_ids": True, "stop_token_ids": []})
    choice = out.choices[0]
    ids = _ids(choice)
    lp = choice.logprobs
    assert lp.tokens == [f"token_id:{t}" for t in ids]
    for t, chosen, top in zip(ids, lp.token_logprobs, lp.top_logprobs):
        best = max(top.values())
        assert chosen == pytest.approx(best)  # greedy draws the most likely token
        assert top[f"token_id:{t}"] == chosen and chosen <= 0


def test_a_stop_token_ending_the_completion_keeps_its_logprob(client):
    """lm-evaluation-harness scores a continuation with echo, max_tokens=1, logprobs=1 and
    reads the last entry as the generated token's. When the greedy next token is a stop
    token, that entry is the stop token's (empty text, its logprob), streamed or not —
    never the last prompt token's."""
    prompt = np.random.default_rng().integers(1, _tiny_vocab(), 6).tolist()
    free = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, logprobs=1, temperature=0,
                                     extra_body={"return_token_ids": True, "stop_token_ids": []}).choices[0]
    greedy, greedy_lp = _ids(free)[0], free.logprobs.token_logprobs[0]
    ask = dict(model=MODEL, prompt=prompt, max_tokens=1, echo=True, logprobs=1, temperature=0,
               extra_body={"stop_token_ids": [greedy]})
    stopped = client.completions.create(**ask).choices[0]
    streamed = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for part in client.completions.create(stream=True, **ask):
        for c in part.choices:
            for key in streamed:
                streamed[key] += getattr(c.logprobs, key) if c.logprobs else []
    for lp in (stopped.logprobs.model_dump(), streamed):
        assert len(lp["tokens"]) == len(prompt) + 1 and lp["tokens"][-1] == ""
        assert lp["token_logprobs"][-1] == pytest.approx(greedy_lp, abs=1e-5)
        assert lp["text_offset"][-1] == sum(len(t) for t in lp["tokens"][:-1])
    assert stopped.finish_reason == "stop"


def test_streamed_text_offsets_are_absolute(client):
    prompt = np.random.default_rng().integers(1, _tiny_vocab(), 4).tolist()
    ask = dict(model=MODEL, prompt=prompt, max_tokens=6, logprobs=1, temperature=0,
               extra_body={"stop_token_ids": []})
    whole = client.completions.create(**ask).choices[0].logprobs.text_offset
    streamed = [o for part in client.completions.create(stream=True, **ask) for c in part.choices
                if c.logprobs for o in c.logprobs.text_offset]
    assert streamed == whole and whole == sorted(whole) and whole[-1] > 0


def test_disconnect_cancels_and_frees_the_slot(server, client):
    async def scenario():
        aclient = openai.AsyncOpenAI(base_url=client.base_url, api_key="unused", max_retries=0)
        common = dict(model=MODEL, temperature=0, extra_body={"stop_token_ids": [], "return_token_ids": True})
        try:
            others = [asyncio.create_task(aclient.completions.create(prompt=[5, 6, i + 1], max_tokens=30, **common))
                      for i in range(2)]
            stream = await aclient.completions.create(prompt=[7, 8], max_tokens=MAX_TOKENS_LIMIT, stream=True, **common)
            seen = 0
            async for chunk in stream:
                seen += len(chunk.choices[0].model_extra["token_ids"])
                if seen >= 3:
                    break
            await stream.close()  # the client goes away mid-stream
            return [await t for t in others]
        finally:
            await aclient.close()

    cancelled_before = server.metric("rwkv7_requests_total", 'finish_reason="cancelled"')
    finished = asyncio.run(scenario())
    assert [len(_ids(o.choices[0])) for o in finished] == [30, 30]
    for _ in range(100):
        if server.metric("rwkv7_requests_total", 'finish_reason="cancelled"') > cancelled_before:
            break
        time.sleep(0.1)
    assert server.metric("rwkv7_requests_total", 'finish_reason="cancelled"') == cancelled_before + 1
    assert server.metric("rwkv7_scheduler_requests", 'state="running"') == 0
    assert server.metric("rwkv7_live_batch") == 0
    assert server.metric("rwkv7_decode_bucket", 'replica="0"') >= 1  # the bucket of the last step
    assert server.metric("rwkv7_engine_info", 'dtype="float32",kernels="native"') == 1  # what serves (auto, CPU)


@pytest.mark.parametrize("body, param", [
    ({"prompt": [1, 2], "max_tokens": -1}, "max_tokens"),
    ({"prompt": [1, 2], "top_p": 1.5}, "top_p"),
    ({"prompt": [1, 2], "temperature": -0.1}, "temperature"),
    ({"prompt": [1, 2], "n": 0}, "n"),
    ({"prompt": [1, 2], "logprobs": 21}, "logprobs"),
    ({"prompt": [1, 2], "seed": -5}, "seed"),
    ({"prompt": [1, 2], "best_of": 2}, "best_of"),
    ({"prompt": [1, 2], "stop_token_ids": [10**9]}, "stop_token_ids"),
    ({"prompt": [1, 2], "banned_token_ids": ["x"]}, "banned_token_ids[0]"),
    ({"prompt": [1, 10**9]}, "prompt"),
    ({"prompt": [[1, 2], [3, -4]]}, "prompt[1]"),
    ({"prompt": []}, "prompt"),
    ({"prompt": "text needs the World vocabulary"}, "prompt"),
    ({"prompt": [1, 2], "stop": ["x"]}, "stop"),
    ({"prompt": list(range(1, 66))}, "prompt"),
    ({"max_tokens": 3}, "prompt"),
])
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    status, text = server.post("/v1/completions", json.dumps({"model": MODEL, **body}).encode())
    assert status == 400, text
    error = json.loads(text)["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert param.split("[")[0] in error["message"] or "prompt" in error["message"]


def test_malformed_json_body_limit_and_queue_limit(server, client):
    status, text = server.post("/v1/completions", b'{"prompt": [1, 2')
    assert status == 400 and "malformed JSON" in json.loads(text)["error"]["message"]
    status, text = server.post("/v1/completions", json.dumps({"prompt": [1] * 8000}).encode())
    assert status == 413, text
    with pytest.raises(openai.RateLimitError):  # more choices than --max-waiting may queue
        client.completions.create(model=MODEL, prompt=[[1, 2]] * (MAX_WAITING + 1), max_tokens=1)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="another-model", prompt=[1, 2], max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="World vocabulary"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    # the server still serves after all of that
    after = client.completions.create(model=MODEL, prompt=[[3, 4], [5]], max_tokens=2,
                                      extra_body={"return_token_ids": True, "stop_token_ids": []})
    assert [len(_ids(c)) for c in after.choices] == [2, 2]


def _post_chunked(server, body: bytes) -> tuple[int, dict]:
    """POST a body with Transfer-Encoding: chunked (no Content-Length), 4 kB a chunk."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", "/v1/completions", body=(body[i:i + 4096] for i in range(0, len(body), 4096)),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_a_chunked_body_over_the_limit_is_413_and_one_under_it_is_served(server):
    status, answer = _post_chunked(server, json.dumps({"prompt": [1] * 8000, "max_tokens": 1}).encode())
    assert status == 413 and "20000 bytes" in answer["error"]["message"], answer
    status, answer = _post_chunked(server, json.dumps({"prompt": [3, 4], "max_tokens": 2, "stop_token_ids": [],
                                                       "return_token_ids": True}).encode())
    assert status == 200 and len(answer["choices"][0]["token_ids"]) == 2, answer


def test_unknown_paths_share_one_metrics_label_and_head_answers_200(server):
    before = len(server.get("/metrics")[1])
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        for i in range(300):  # distinct unknown URLs: one series, not 300
            conn.request("GET", f"/no/such/path/{i}?q={i}")
            response = conn.getresponse()
            response.read()
            assert response.status == 404
        for path in ("/health", "/metrics"):
            conn.request("HEAD", path)
            response = conn.getresponse()
            assert (response.status, response.read()) == (200, b""), path
    finally:
        conn.close()
    text = server.get("/metrics")[1]
    assert "/no/such" not in text and len(text) - before < 300
    assert server.metric("rwkv7_http_requests_total", 'endpoint="other",status="404"') >= 300
