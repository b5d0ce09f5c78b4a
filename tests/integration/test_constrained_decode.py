"""Grammar-constrained decoding under the scheduler (torch engine, tiny random model with the
World vocabulary: random weights write junk unless constrained, so every constrained output
that finishes "stop" must match its constraint)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from rwkv7_core.tokenizer import WorldTokenizer
from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig, generate
from scheduler.constraint import Constraint
from tests.support.scheduler_engines import FakeEngine

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                              "maximum": 99},
                                           "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2}},
          "required": ["ok", "n", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    import torch

    import rwkv_torch_ref
    from rwkv7_core.config import named_config
    from rwkv7_core.random_weights import write_random_checkpoint
    from rwkv_torch_ref.engine import TorchEngine
    path = tmp_path_factory.mktemp("world") / "tiny-world.safetensors"
    write_random_checkpoint(path, named_config("tiny")._replace(vocab_size=65536), seed=7)
    torch.set_num_threads(1)
    return TorchEngine(rwkv_torch_ref.load(path, dtype="float32"))


def test_constrained_outputs_match_and_do_not_depend_on_the_batch(engine):
    tok = WorldTokenizer()
    rng = np.random.default_rng()
    constraints = [Constraint.json_schema(SCHEMA), Constraint.choice(["red", "green", "blue"]),
                   Constraint.regex("[a-c]{2}[0-9]"), Constraint.grammar('start: "(" NUM ")"\nNUM: /[0-9]{1,2}/'), None]
    requests = [Request(f"r{i}", tok.encode(f"Item {i}:"), SamplingParams(
        max_tokens=30, temperature=1.0, top_p=0.9, seed=int(rng.integers(2**32))), constraint=constraints[i % 5])
        for i in range(10)]
    config = SchedulerConfig(max_batch=8)
    scheduler = Scheduler(engine, config, tokenizer=tok)
    for r in requests[:5]:
        scheduler.add(r)
    scheduler.add_group([Request(f"g{k}", requests[0].prompt_tokens, requests[0].params.replace(seed=k),
                                 constraint=requests[0].constraint) for k in range(3)])  # n=3 of one prompt
    for r in requests[5:]:
        scheduler.add(r)
    scheduler.run()
    out = scheduler.results
    for r in requests + [Request(f"g{k}", []) for k in range(3)]:
        grouped = r.id.startswith("g")  # the n=3 group of requests[0]: its constraint
        o, c = out[r.id], requests[0].constraint if grouped else r.constraint
        text = tok.decode(o.tokens)
        if c is None:  # unconstrained: any text, ended by a stop token or the length
            assert o.finish_reason in ("stop", "length")
        elif c.kind == "json_schema":
            if o.finish_reason == "stop":
                jsonschema.validate(json.loads(text), SCHEMA)
        else:  # short grammars always complete within 30 tokens
            assert o.finish_reason == "stop", (r.id, text)
            pattern = {"choice": "red|green|blue", "regex": "[a-c]{2}[0-9]", "grammar": r"\([0-9]{1,2}\)"}[c.kind]
            assert re.fullmatch(pattern, text), (r.id, text)
    assert scheduler.stats.mask_steps > 0 and scheduler.stats.mask_rows >= scheduler.stats.mask_steps
    alone = generate(engine, requests[:4], SchedulerConfig(max_batch=1), tokenizer=tok)
    assert [o.tokens for o in alone] == [out[r.id].tokens for r in requests[:4]]
    unconstrained = Scheduler(engine, config, tokenizer=tok)
    unconstrained.add(requests[4])
    unconstrained.run()
    assert unconstrained.stats.mask_steps == 0  # no constrained row: no mask is computed or sent


def test_bad_constraints_fail_before_any_decode_work(engine):
    tok = WorldTokenizer()
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=2), tokenizer=tok)
    bad = {"schema": Constraint.json_schema({"type": "object", "properties": {"a": {"type": "nope"}}}),
           "feature": Constraint.json_schema({"type": "object", "if": {}}), "regex": Constraint.regex("(["),
           "lark": Constraint.grammar("start: missing_rule")}
    for name, c in bad.items():
        scheduler.add(Request(name, [1, 2, 3], SamplingParams(max_tokens=4), constraint=c))
    scheduler.run()
    errors = {name: scheduler.results[name].error for name in bad}
    assert all(scheduler.results[n].finish_reason == "error" for n in bad)
    assert "nope" in errors["schema"] and '"if"' in errors["feature"] and "regex" in errors["regex"]
    assert "missing_rule" in errors["lark"] and all("\n" not in e for e in errors.values())
    assert scheduler.stats.prefill_tokens == 0 and scheduler.stats.decode_steps == 0
    fake = generate(FakeEngine(), [Request("f", [1, 2], SamplingParams(max_tokens=2),
                                           constraint=Constraint.regex("a"))], tokenizer=tok)[0]
    assert fake.finish_reason == "error" and "TOKEN_MASK" in fake.error
    with pytest.raises(ValueError, match="kind"):
        Constraint("yaml", "")
