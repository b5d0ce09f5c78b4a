"""rwkv7-serve on the tiny-world random model (text prompts, World chat format) behind an
API key, driven by the official openai client. One server for the module."""
from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")

from rwkv7_apps.serve.chat import encode, render  # noqa: E402
from rwkv7_core.tokenizer import WorldTokenizer  # noqa: E402
from tests.rwkv7_apps.serve_harness import running_server  # noqa: E402

KEY = "test-key-123"
MODEL = "tiny-chat"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(["--random-model", "tiny-world", "--max-batch", "4", "--api-key", KEY,
                         "--served-model-name", MODEL, "--max-tokens", "12"],
                        tmp_path_factory.mktemp("serve_world")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def test_api_key_is_required_on_v1_routes(server):
    for key in ("wrong", ""):
        bad = openai.OpenAI(base_url=server.url + "/v1", api_key=key or "x", max_retries=0,
                            default_headers={} if key else {"Authorization": ""})
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model=MODEL, prompt="hi", max_tokens=1)
    assert server.get("/health")[0] == 200  # health stays open; metrics need the key (a side channel)
    assert server.get("/metrics")[0] == 401


def test_chat_renders_the_world_format_and_streams_the_same_text(client):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": "Hello!\n\n\nWhat now?"}, {"role": "user", "content": "Tell me"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=10)
    prompt = "System: You are terse.\n\nUser: Hi there\n\nAssistant: Hello!\nWhat now?\n\nUser: Tell me\n\nAssistant:"
    assert render([(m["role"], m["content"]) for m in messages]) == prompt
    assert whole.usage.prompt_tokens == len(encode(WorldTokenizer(), [(m["role"], m["content"]) for m in messages]))
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    stream = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=10,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stop_strings_cut_the_text_streamed_or_not(client):
    prompt = "The quick brown fox"
    ids = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=12,
                                    extra_body={"return_token_ids": True, "stop_token_ids": []})
    full = ids.choices[0].text
    assert WorldTokenizer().decode(ids.choices[0].model_extra["token_ids"]) == full
    stop = full[len(full) // 2:len(full) // 2 + 3]
    if not stop.strip():
        pytest.skip("the greedy text has no usable middle")
    expected = full[:full.index(stop)]
    cut = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=12, stop=[stop],
                                    extra_body={"stop_token_ids": []})
    assert (cut.choices[0].text, cut.choices[0].finish_reason) == (expected, "stop")
    streamed = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=12, stop=stop,
                                         stream=True, extra_body={"stop_token_ids": []})
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_chat_logprobs_and_token_ids(client):
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                         logprobs=True, top_logprobs=2, temperature=0,
                                         extra_body={"return_token_ids": True, "stop_token_ids": []})
    choice = out.choices[0]
    content = choice.logprobs.content
    ids = choice.model_extra["token_ids"]
    assert len(content) == len(ids) == out.usage.completion_tokens
    tok = WorldTokenizer()
    for item, t in zip(content, ids):
        assert bytes(item.bytes) == tok.decode_bytes([t])
        assert len(item.top_logprobs) == 2 and item.top_logprobs[0].logprob == pytest.approx(item.logprob)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model=MODEL, messages=[])


def test_openai_fields_are_honoured_ignored_or_refused_by_name(server, client):
    """The field policy (docs/server.md): what we can do is honoured, what has no meaning here
    is accepted, and the rest is a 400 naming the field, through the official SDK."""
    say = [{"role": "user", "content": "Name a colour"}]
    base = dict(model=MODEL, temperature=0, max_tokens=6)

    def reply(**kw):
        out = client.chat.completions.create(**{**base, "messages": say, **kw}).choices[0]
        return out.message.content, out.finish_reason

    # developer = system, and content as text parts = the joined string
    plain = client.chat.completions.create(**base, messages=[{"role": "system", "content": "Be brief."}, *say])
    parts = client.chat.completions.create(**base, messages=[
        {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]}, *say])
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens
    # ignore_eos: the default stop tokens no longer end the output; explicit stop_token_ids still do
    free = client.completions.create(model=MODEL, prompt="Once", temperature=0, max_tokens=6,
                                     extra_body={"stop_token_ids": [], "return_token_ids": True}).choices[0]
    ids = free.model_extra["token_ids"]
    eos = client.completions.create(model=MODEL, prompt="Once", temperature=0, max_tokens=6,
                                    extra_body={"ignore_eos": True, "return_token_ids": True}).choices[0]
    assert eos.model_extra["token_ids"] == ids
    cut = client.completions.create(model=MODEL, prompt="Once", temperature=0, max_tokens=6,
                                    extra_body={"ignore_eos": True, "stop_token_ids": [ids[2]],
                                                "return_token_ids": True}).choices[0]
    assert cut.model_extra["token_ids"] == ids[:ids.index(ids[2])] and cut.finish_reason == "stop"
    # logit_bias -100 bans, like banned_token_ids
    first = client.completions.create(model=MODEL, prompt="Once", temperature=0, max_tokens=3,
                                      logit_bias={str(ids[0]): -100},
                                      extra_body={"stop_token_ids": [], "return_token_ids": True}).choices[0]
    banned = client.completions.create(model=MODEL, prompt="Once", temperature=0, max_tokens=3,
                                       extra_body={"stop_token_ids": [], "banned_token_ids": [ids[0]],
                                                   "return_token_ids": True}).choices[0]
    assert first.model_extra["token_ids"] == banned.model_extra["token_ids"] and ids[0] not in banned.model_extra[
        "token_ids"]
    # accepted and ignored; a 64-bit seed; logprobs=false with top_logprobs=0
    assert reply(store=False, metadata={"team": "a"}, service_tier="auto", parallel_tool_calls=False,
                 seed=2**40, logprobs=False, top_logprobs=0, response_format={"type": "text"}) == reply()
    # usage in every chunk; include_obfuscation accepted
    chunks = list(client.chat.completions.create(**base, messages=say, stream=True, stream_options={
        "include_usage": True, "continuous_usage_stats": True, "include_obfuscation": False}))
    assert all(c.usage is not None for c in chunks)
    assert [c.usage.completion_tokens for c in chunks] == sorted(c.usage.completion_tokens for c in chunks)
    # what we cannot do: a 400 naming the field
    for kw, field in ((dict(logit_bias={"5": 3.0}), "logit_bias"),
                      (dict(response_format={"type": "xml"}), "response_format"),
                      (dict(stream_options={"include_usage": True}), "stream_options"),
                      (dict(tools=[{"type": "function", "function": {"parameters": {}}}]), "tools")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**base, messages=say, **kw)
        assert e.value.body["param"] == field, e.value.body
    models = client.models.list().data
    assert models[0].created > 1_700_000_000


def test_tokenize_and_detokenize_count_what_the_completions_count(server, client):
    """vLLM's /tokenize and /detokenize: a load tool's token counts equal the usage the
    completion reports, for a text prompt and for chat messages; detokenize inverts."""
    import json
    import random

    auth = {"Authorization": f"Bearer {KEY}"}
    text = "".join(random.choice("abc xyz 字 é\n") for _ in range(40))
    status, answer = server.post("/tokenize", json.dumps({"model": MODEL, "prompt": text}).encode(), auth)
    tokenized = json.loads(answer)
    assert status == 200 and tokenized["count"] == len(tokenized["tokens"]) == len(WorldTokenizer().encode(text))
    usage = client.completions.create(model=MODEL, prompt=text, max_tokens=1).usage
    assert usage.prompt_tokens == tokenized["count"]
    messages = [{"role": "user", "content": text}]
    status, answer = server.post("/tokenize", json.dumps({"messages": messages}).encode(), auth)
    chat_usage = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1).usage
    assert status == 200 and json.loads(answer)["count"] == chat_usage.prompt_tokens
    status, answer = server.post("/detokenize", json.dumps({"tokens": tokenized["tokens"]}).encode(), auth)
    assert status == 200 and json.loads(answer)["prompt"] == text
    for path, body, param in (("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": "\ud800"}, "prompt"),
                              ("/detokenize", {"tokens": [10**9]}, "tokens")):
        status, answer = server.post(path, json.dumps(body).encode(), auth)
        assert status == 400 and json.loads(answer)["error"]["param"] == param, answer
    assert server.post("/tokenize", b'{"prompt": "x"}')[0] == 401  # behind the API key like /v1
