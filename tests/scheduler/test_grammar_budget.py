"""The per-step mask budget (issue 37, item 4): a row under an ambiguous grammar, whose mask
work grows with every token, fails with an error naming the budget once a mask needs more
parser items than ``GrammarLimits.step_items``, and the unconstrained rows beside it draw
exactly the tokens they draw alone (torch engine, tiny random model, World vocabulary).
benchmarks/grammar_neighbours.py measures the neighbours' step time."""
from __future__ import annotations

import numpy as np
import pytest

from rwkv7_core.tokenizer import WorldTokenizer
from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig, generate
from scheduler.constraint import Constraint
from scheduler.grammar import current_limits, set_limits
from scheduler.grammar_limits import GrammarLimits

pytest.importorskip("llguidance")

AMBIGUOUS = Constraint.grammar('start: s\ns: s s | "a" | "aa"\n')


@pytest.fixture
def engine(tmp_path):
    import torch

    import rwkv_torch_ref
    from rwkv7_core.config import named_config
    from rwkv7_core.random_weights import write_random_checkpoint
    from rwkv_torch_ref.engine import TorchEngine
    path = tmp_path / "tiny-world.safetensors"
    write_random_checkpoint(path, named_config("tiny")._replace(vocab_size=65536), seed=7)
    torch.set_num_threads(1)
    return TorchEngine(rwkv_torch_ref.load(path, dtype="float32"))


@pytest.fixture
def step_items():
    previous = current_limits()
    items = int(np.random.default_rng().integers(150, 300))
    set_limits(GrammarLimits(step_items=items))
    yield items
    set_limits(previous)


def test_an_ambiguous_grammar_fails_alone_past_the_step_budget(engine, step_items):
    rng = np.random.default_rng()
    tok = WorldTokenizer()
    neighbours = [Request(f"n{i}", rng.integers(1, 65536, int(rng.integers(2, 8))).tolist(),
                          SamplingParams(max_tokens=int(rng.integers(20, 40)), stop_tokens=[])) for i in range(3)]
    alone = {r.id: o.tokens for r, o in zip(neighbours, generate(engine, neighbours, SchedulerConfig(max_batch=4)))}
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=4), tokenizer=tok)
    scheduler.add(Request("ambiguous", tok.encode("a"), SamplingParams(  # never ends: end-of-text banned
        max_tokens=2000, stop_tokens=[], banned_tokens=(0,), temperature=1.0, seed=int(rng.integers(2**32))),
        constraint=AMBIGUOUS))
    for r in neighbours:
        scheduler.add(r)
    scheduler.run()
    out = scheduler.results["ambiguous"]
    assert out.finish_reason == "error" and f"limit {step_items}; mask" in out.error, out
    assert "\n" not in out.error and len(out.tokens) < 2000
    assert set(tok.decode(out.tokens)) <= {"a"}
    assert {r.id: scheduler.results[r.id].tokens for r in neighbours} == alone
