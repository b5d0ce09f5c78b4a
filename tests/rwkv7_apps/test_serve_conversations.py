"""rwkv7-serve --data-parallel 2 on the tiny-world random model (torch backend: two CPU
replicas, one thread each, nothing to compile; JAX replicas are covered by
test_data_parallel_cli.py) with a named initial state and a small response store, driven by
the official openai client: the Responses API (plain, streamed, a 3-turn
previous_response_id chain equal to single requests of the whole history's tokens,
retrieve, delete, eviction, bad ids and models), completions and chat on both replicas,
conversation affinity in /metrics, a --state that changes completions and chat exactly
as rwkv7-generate's --state does, and structured output and tool calls on both replicas.
One server."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

openai = pytest.importorskip("openai")

from rwkv7_apps.engines import random_model_config  # noqa: E402
from rwkv7_core.state_files import save_state, zero_state  # noqa: E402
from rwkv7_core.tokenizer import WorldTokenizer  # noqa: E402
from tests.rwkv7_apps.cli_harness import cli_env, read_results, write_jsonl  # noqa: E402
from tests.rwkv7_apps.serve_harness import running_server  # noqa: E402

MODEL = "tiny-conv"
STORE = 4
TOKENS = 8
GREEDY = {"temperature": 0, "max_output_tokens": TOKENS}


@pytest.fixture(scope="module")
def state_file(tmp_path_factory):
    """A random (non-zero) state of the tiny-world shape."""
    config = random_model_config("tiny-world")
    rng = np.random.default_rng()
    zero = zero_state(config)
    state = zero._replace(att_shift=rng.normal(0, 1, zero.att_shift.shape).astype(np.float32),
                          wkv=rng.normal(0, 0.5, zero.wkv.shape).astype(np.float32),
                          ffn_shift=rng.normal(0, 1, zero.ffn_shift.shape).astype(np.float32), tokens=5)
    path = tmp_path_factory.mktemp("state") / "tuned.safetensors"
    save_state(path, state, config)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, state_file):
    with running_server(["--random-model", "tiny-world", "--backend", "torch", "--data-parallel", 2,
                         "--max-batch", 4, "--served-model-name", MODEL, "--max-tokens", TOKENS,
                         "--state", f"tuned={state_file}", "--response-store-count", STORE],
                        tmp_path_factory.mktemp("serve_conv")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _ids(client, prompt: list[int], state: str | None = None) -> list[int]:
    """Greedy completion token ids of a token prompt, ending as a chat turn ends."""
    extra = {"return_token_ids": True, **({"state": state} if state else {})}
    out = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=TOKENS,
                                    stop=["\n\nUser:"], extra_body=extra)
    return out.choices[0].model_extra["token_ids"]


def test_a_chain_of_three_turns_equals_single_requests_of_the_whole_history(client):
    tok = WorldTokenizer()
    rng = np.random.default_rng()
    words = [" ".join(rng.choice(["red", "fox", "sky", "tree", "moon", "river", "stone"], 3)) for _ in range(3)]
    state = "tuned" if rng.random() < 0.5 else None  # the chain keeps the state it started from
    history, previous = tok.encode(f"System: Be brief.\n\nUser: {words[0]}\n\nAssistant:"), None
    for turn, text in enumerate(words):
        extra = {"state": state} if state and turn == 0 else {}
        r = client.responses.create(model=MODEL, input=text, previous_response_id=previous, extra_body=extra,
                                    instructions="Be brief." if turn == 0 else None, **GREEDY)
        consumed = len(history)  # the previous turn's prompt + output (the whole first prompt at turn 0)
        if turn:
            history += tok.encode(f"\n\nUser: {text}\n\nAssistant:")
            # the turn cache (on by default) served all the previous turn fed the model: only the
            # new message (and the reply's last, unfed token) was prefilled
            assert r.usage.input_tokens_details.cached_tokens >= consumed - 1
        ids = _ids(client, history, state)  # the whole conversation's tokens as one request
        assert r.output_text == tok.decode(ids).split("\n\nUser:")[0]
        assert r.usage.input_tokens == len(history) and r.usage.output_tokens == len(ids)
        assert r.status == ("incomplete" if len(ids) == TOKENS else "completed")
        assert not tok.decode(ids).endswith("\n\nUser:")  # a random model: the marker never ends a turn
        assert r.previous_response_id == previous and r.model == MODEL
        history, previous = history + ids, r.id
    assert client.responses.retrieve(previous).output_text == r.output_text


def test_streamed_events_carry_the_same_text(client):
    whole = client.responses.create(model=MODEL, input=[{"role": "user", "content": "Tell me more"}], **GREEDY)
    events = list(client.responses.create(model=MODEL, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Tell me"}, {"type": "input_text", "text": " more"}]}], stream=True, **GREEDY))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    done = events[-1].response
    assert done.output_text == whole.output_text and done.usage.output_tokens == whole.usage.output_tokens
    assert client.responses.retrieve(done.id).output_text == whole.output_text  # streamed ones are stored too


def test_store_delete_eviction_and_bad_ids(client):
    first = client.responses.create(model=MODEL, input="one", **GREEDY)
    assert client.responses.retrieve(first.id).id == first.id
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError, match=first.id):
        client.responses.retrieve(first.id)
    kept = [client.responses.create(model=MODEL, input=f"turn {i}", **GREEDY).id for i in range(STORE + 1)]
    with pytest.raises(openai.NotFoundError, match=re.escape(f"previous_response_id: response {kept[0]!r}")):
        client.responses.create(model=MODEL, input="again", previous_response_id=kept[0], **GREEDY)
    assert [client.responses.retrieve(i).id for i in kept[1:]] == kept[1:]
    unstored = client.responses.create(model=MODEL, input="no", store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError, match=unstored.id):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError, match="cannot go on with model 'other'"):
        client.responses.create(model="other", input="x", previous_response_id=kept[-1], **GREEDY)
    with pytest.raises(openai.BadRequestError, match="unknown state 'nope' \\(registered: tuned\\)"):
        client.responses.create(model=MODEL, input="x", extra_body={"state": "nope"}, **GREEDY)
    with pytest.raises(openai.BadRequestError, match="unknown field 'bogus'"):
        client.responses.create(model=MODEL, input="x", extra_body={"bogus": 1}, **GREEDY)


def _routed(server) -> list[float]:
    return [server.metric("rwkv7_replica_routed_total", f'replica="{i}"') for i in range(2)]


def _replica_of(server, send) -> tuple[int, object]:
    """Which replica the request ``send()`` makes was routed to, and its result."""
    before = _routed(server)
    result = send()
    delta = [a - b for a, b in zip(_routed(server), before)]
    assert sorted(delta) == [0, 1]
    return delta.index(1), result


def test_turns_of_a_conversation_stay_on_their_replica(server, client):
    """Fresh conversations spread over both replicas (least loaded, then fewest routed); each
    next turn (Responses chain, chat history) goes back to its first turn's replica."""
    kept = server.metric("rwkv7_affinity_routes_total", 'result="kept"')
    firsts = {}
    for i in range(4):
        where, r = _replica_of(server, lambda: client.responses.create(model=MODEL, input=f"topic {i}", **GREEDY))  # noqa: B023 - called in this iteration
        firsts.setdefault(where, r)
        if len(firsts) == 2:
            break
    assert len(firsts) == 2
    busier = int(np.argmax(_routed(server)))  # least-loaded routing alone would send its turn elsewhere
    for replica in (busier, 1 - busier):
        where, _ = _replica_of(server, lambda: client.responses.create(
            model=MODEL, input="next", previous_response_id=firsts[replica].id, **GREEDY))  # noqa: B023 - called in this iteration
        assert where == replica
    messages = [{"role": "user", "content": "Hello chat"}]
    where, reply = _replica_of(server, lambda: client.chat.completions.create(model=MODEL, messages=messages,
                                                                            temperature=0, max_tokens=TOKENS))
    if where != busier:  # make the chat's first turn sit on the busier replica too
        messages = [{"role": "user", "content": "Hello chat!"}]
        for _ in range(3):
            where, reply = _replica_of(server, lambda: client.chat.completions.create(
                model=MODEL, messages=messages, temperature=0, max_tokens=TOKENS))
            if where == int(np.argmax(_routed(server))):
                break
    messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                 {"role": "user", "content": "And then?"}]
    again, _ = _replica_of(server, lambda: client.chat.completions.create(model=MODEL, messages=messages,
                                                                        temperature=0, max_tokens=TOKENS))
    assert again == where
    assert server.metric("rwkv7_affinity_routes_total", 'result="kept"') - kept == 3
    assert server.metric("rwkv7_affinity_routes_total", 'result="moved"') == 0


def test_both_replicas_answer_completions_alike(server, client):
    """The same prompt twice at once: the second goes to the idle replica (nothing recorded
    yet to keep it with the first), and both answer the same greedy tokens."""
    prompt = np.random.default_rng().integers(1, 65536, 6).tolist()
    before = _routed(server)
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda _: client.completions.create(
            model=MODEL, prompt=prompt, temperature=0, max_tokens=TOKENS, extra_body={"return_token_ids": True}),
            range(2)))
    assert [a - b for a, b in zip(_routed(server), before)] == [1, 1]
    assert outs[0].choices[0].model_extra["token_ids"] == outs[1].choices[0].model_extra["token_ids"]
    assert server.metric("rwkv7_replica_requests_total", 'replica="0"') > 0
    assert server.metric("rwkv7_replica_requests_total", 'replica="1"') > 0


def test_structured_output_and_tool_calls_on_both_replicas(server, client):
    """A json_schema answer and a tool call, each sent twice at once (one per replica): every
    answer is valid, and a seed gives the same answer on either replica."""
    schema = {"type": "object", "properties": {"label": {"enum": ["a", "b", "c"]},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["label", "n"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"key": {"enum": ["x", "y"]}}, "required": ["key"],
        "additionalProperties": False}}}]
    seed = int(np.random.default_rng().integers(1 << 30))
    sends = {"json": dict(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}),
             "tool": dict(tools=tools, tool_choice="required", parallel_tool_calls=False)}
    for kind, extra in sends.items():
        before = _routed(server)
        with ThreadPoolExecutor(2) as pool:
            outs = list(pool.map(lambda _: client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Go"}], max_tokens=64, seed=seed, **extra)  # noqa: B023 - called in this iteration
                .choices[0], range(2)))
        assert [a - b for a, b in zip(_routed(server), before)] == [1, 1]
        for out in outs:
            if kind == "json":
                assert out.finish_reason == "stop" and json.loads(out.message.content)["label"] in "abc"
            else:
                call = out.message.tool_calls[0].function
                assert out.finish_reason == "tool_calls" and call.name == "lookup"
                assert json.loads(call.arguments)["key"] in ("x", "y")
        assert outs[0].message.model_dump(exclude={"tool_calls"}) == outs[1].message.model_dump(exclude={"tool_calls"})


def test_a_named_state_changes_the_output_as_the_batch_cli_does(server, client, state_file, tmp_path):
    chat_prompt = "User: hi there\n\nAssistant:"
    prompt = np.random.default_rng().integers(1, 65536, 5).tolist()
    served = {}
    for state in ("tuned", None):
        out = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=TOKENS, logprobs=1,
                                        extra_body={"return_token_ids": True, "state": state})
        served[state] = out.choices[0].model_extra["token_ids"]
        served["logprobs", state] = out.choices[0].logprobs.token_logprobs
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi there"}],
                                               temperature=0, max_tokens=TOKENS, extra_body={"state": state})
        served["chat", state] = reply.choices[0].message.content
    # the state moves the logits (a random model's greedy tokens may still coincide)
    assert served["logprobs", "tuned"] != served["logprobs", None]
    with pytest.raises(openai.BadRequestError, match=r"state: unknown state 'other' \(registered: tuned\)"):
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, extra_body={"state": "other"})
    rows = [{"id": "s", "tokens": prompt, "state": "tuned"}, {"id": "z", "tokens": prompt},
            {"id": "cs", "prompt": chat_prompt, "state": "tuned", "stop": ["\n\nUser:"]},
            {"id": "cz", "prompt": chat_prompt, "stop": ["\n\nUser:"]}]
    inp = write_jsonl(tmp_path / "in.jsonl", [{**r, "temperature": 0, "max_tokens": TOKENS} for r in rows])
    out = tmp_path / "out.jsonl"
    env = {**cli_env(tmp_path), "XDG_CACHE_HOME": str(server.cache)}  # the same random model file
    proc = subprocess.run([sys.executable, "-m", "rwkv7_apps.generate", "--random-model", "tiny-world", "--backend",
                           "torch", "--input", inp, "--output", out, "--state", f"tuned={state_file}"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    batch = {r["id"]: r for r in read_results(out)}
    assert (batch["s"]["tokens"], batch["z"]["tokens"]) == (served["tuned"], served[None])
    tok = WorldTokenizer()
    for key, state in (("cs", "tuned"), ("cz", None)):
        assert tok.decode(batch[key]["tokens"]).split("\n\nUser:")[0] == served["chat", state]
