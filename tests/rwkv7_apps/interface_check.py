"""One check of the scheduler interface (scheduler/interface.py) that every implementation
passes: each member read, each method called once on the tiny model (a few tokens)."""
from __future__ import annotations

import numpy as np

from scheduler import Request, SamplingParams, SchedulerConfig


def exercise_interface(sched) -> None:
    """Call every member of ``sched`` (an implementation with the tiny model's engine) and
    check what each gives: a group's members with one seed decode the same tokens, a request
    with logprobs gets one score per token, a cancelled one finishes "cancelled"."""
    assert isinstance(sched.config, SchedulerConfig) and sched.tokenizer is None  # no World vocabulary
    assert sched.logprobs_unsupported is None and sched.engine.vocab_size == 512
    sched.precompile()
    prompt = [5, 17, 200, 3]
    greedy = SamplingParams(max_tokens=4, stop_tokens=(), seed=7)
    sched.add(Request("one", prompt, SamplingParams(max_tokens=3, stop_tokens=(), logprobs=1)))
    sched.add_group([Request(f"group{i}", prompt, greedy) for i in range(2)])
    sched.add(Request("cancelled", prompt, SamplingParams(max_tokens=60_000, stop_tokens=())))
    sched.cancel("cancelled")
    assert set(sched.queue_sizes()) == {"waiting", "prefill", "ready", "running"}
    assert set(sched.unstarted()) <= {"one", "group0", "group1", "cancelled"}
    scored = sched.score(prompt)
    assert np.asarray(scored.chosen).size == len(prompt) - 1
    tokens, logprobs, outs = [], [], {}
    sched.run(on_token=lambda rid, t: tokens.append(rid), on_finish=lambda out: outs.__setitem__(out.id, out),
              should_stop=lambda: False, on_logprobs=lambda rid, lp: logprobs.append(rid),
              serve_until=lambda: True)
    assert {k: o.finish_reason for k, o in outs.items()} == {"one": "length", "group0": "length",
                                                            "group1": "length", "cancelled": "cancelled"}
    assert outs["group0"].tokens == outs["group1"].tokens and len(outs["group0"].tokens) == 4
    assert logprobs.count("one") == tokens.count("one") == 3
    assert all(0 <= b <= sched.config.max_batch for b in sched.decode_buckets())
    assert sched.stats.requests_finished >= 3 and sched.unstarted() == []
