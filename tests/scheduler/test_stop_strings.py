"""Stop strings in the scheduler, with a byte-level tokenizer whose tokens cut UTF-8
characters anywhere: a request ends on the token completing the first stop string even when
the string (and its characters) span tokens, and the most and longest stop strings allowed,
none of which completes, leave the output exactly as it is without them."""
from __future__ import annotations

import numpy as np

from rwkv7_core.sampling import MAX_STOP_LENGTH, MAX_STOP_STRINGS, MAX_STOP_TOKENS
from scheduler import Request, SamplingParams, SchedulerConfig, generate
from tests.support.scheduler_engines import FakeEngine, reference_decode

V = 64


def random_text(rng, n: int) -> str:
    return "".join(rng.choice(list("ab\u00e9\u4e2d\U0001f600"), n))  # 1, 1, 2, 3 and 4 UTF-8 bytes


class ByteTokenizer:
    """Token t -> the t-th of V random cuts of a random multi-byte text."""

    def __init__(self, rng):
        data = random_text(rng, 3 * V).encode()
        cuts = sorted(rng.choice(np.arange(1, len(data)), V - 1, replace=False).tolist())
        self.table = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]

    def decode_bytes(self, tokens):
        return b"".join(self.table[t] for t in tokens)


def test_a_stop_string_across_tokens_ends_the_request_on_its_last_token():
    rng = np.random.default_rng()
    tok = ByteTokenizer(rng)
    requests, want = [], {}
    for i in range(6):
        prompt = rng.integers(1, V, 4).tolist()
        free = reference_decode(FakeEngine(V), prompt, SamplingParams(max_tokens=40, stop_tokens=()))
        text = tok.decode_bytes(free).decode(errors="replace")
        stops = []
        while len(stops) < 2:
            start = int(rng.integers(len(text) - 6))
            s = text[start:start + int(rng.integers(1, 6))]
            if "\ufffd" not in s:
                stops.append(s)
        end = min(k for k in range(1, len(free) + 1)
                  if any(s in tok.decode_bytes(free[:k]).decode(errors="replace") for s in stops))
        requests.append(Request(f"r{i}", prompt, SamplingParams(max_tokens=40, stop_tokens=(), stop=tuple(stops))))
        want[f"r{i}"] = free[:end]
    out = {o.id: o for o in generate(FakeEngine(V), requests, SchedulerConfig(max_batch=4), tokenizer=tok)}
    for rid, tokens in want.items():
        assert out[rid].tokens == tokens and out[rid].finish_reason == "stop", rid


def test_the_most_and_longest_stop_strings_change_nothing_when_none_completes():
    rng = np.random.default_rng()
    tok = ByteTokenizer(rng)
    prompt = rng.integers(1, V, 5).tolist()
    plain = SamplingParams(max_tokens=60, stop_tokens=())
    free = reference_decode(FakeEngine(V), prompt, plain)
    text = tok.decode_bytes(free).decode(errors="replace")
    # half near misses (each a stretch of the output, then a character it never holds), half long
    near = [(text[i:] + "\x00")[-MAX_STOP_LENGTH:] for i in range(MAX_STOP_STRINGS // 2)]
    long = [random_text(rng, MAX_STOP_LENGTH) for _ in range(MAX_STOP_STRINGS - len(near))]
    stopped = plain.replace(stop=tuple(near + long)).validate(V)
    out = generate(FakeEngine(V), [Request("plain", prompt, plain), Request("stops", prompt, stopped)],
                   SchedulerConfig(max_batch=2), tokenizer=tok)
    assert {o.id: (o.tokens, o.finish_reason) for o in out} == {"plain": (free, "length"), "stops": (free, "length")}


def test_too_many_or_too_long_stops_fail_alone_naming_the_limit():
    rng = np.random.default_rng()
    tok = ByteTokenizer(rng)
    prompt = rng.integers(1, V, 5).tolist()
    bad = {"strings": ({"stop": ("a",) * (MAX_STOP_STRINGS + 1)}, f"more than the limit {MAX_STOP_STRINGS}"),
           "long": ({"stop": (random_text(rng, MAX_STOP_LENGTH + 1),)}, f"longer than the limit {MAX_STOP_LENGTH}"),
           "ids": ({"stop_tokens": (1,) * (MAX_STOP_TOKENS + 1)}, f"more than the limit {MAX_STOP_TOKENS}")}
    good = SamplingParams(max_tokens=8, stop_tokens=())
    out = {o.id: o for o in generate(FakeEngine(V), [Request("good", prompt, good)] + [
        Request(name, prompt, SamplingParams(**fields)) for name, (fields, _) in bad.items()], tokenizer=tok)}
    assert out["good"].tokens == reference_decode(FakeEngine(V), prompt, good)
    for name, (_, why) in bad.items():
        assert out[name].finish_reason == "error" and why in out[name].error and len(out[name].error) < 200, out[name]
