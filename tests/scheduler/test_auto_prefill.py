"""AUTO prefill: one prompt per call when one waits, flattened calls when several do, serial
on engines without Capability.VARLEN_PREFILL; the tokens never depend on the policy."""
from __future__ import annotations

import numpy as np

from scheduler import PrefillPolicy, Request, SamplingParams, Scheduler, SchedulerConfig
from tests.support.scheduler_engines import CountingEngine, FakeEngine, reference_decode


class RecordingEngine(CountingEngine):
    """CountingEngine that logs how many prompts each prefill call carried."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def prefill(self, tokens, start=None):
        self.calls.append(("serial", 1))
        return super().prefill(tokens, start)

    def prefill_varlen(self, prompts, starts, token_rows):
        assert sum(len(p) for p in prompts) <= token_rows
        self.calls.append(("varlen", len(prompts)))
        return [CountingEngine.prefill(self, p, s) for p, s in zip(prompts, starts)]


def _requests(rng, n, prefix="r"):
    return [Request(f"{prefix}{i}", rng.integers(1, 64, int(rng.integers(1, 40))).tolist(),
                    SamplingParams(max_tokens=int(rng.integers(1, 6)), stop_tokens=(), seed=i)) for i in range(n)]


def test_auto_is_the_default_and_plans_by_how_many_wait():
    assert SchedulerConfig().validated().prefill_policy is PrefillPolicy.AUTO
    rng = np.random.default_rng()
    engine = RecordingEngine()
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=64, chunk=64))
    lone = _requests(rng, 1, "lone")[0]
    scheduler.add(lone)
    scheduler.run()
    assert engine.calls == [("serial", 1)]
    assert scheduler.results.pop(lone.id).tokens == engine.expected_tokens(lone.prompt_tokens, lone.params)
    engine.calls.clear()
    many = _requests(rng, 40)
    for r in many:
        scheduler.add(r)
    scheduler.run()
    varlen = [n for kind, n in engine.calls if kind == "varlen"]
    assert varlen and max(varlen) > 1
    assert sum(varlen) + sum(1 for kind, _ in engine.calls if kind == "serial") >= len(many)
    for r in many:
        assert scheduler.results[r.id].tokens == engine.expected_tokens(r.prompt_tokens, r.params)


def test_a_prompt_that_fills_the_chunk_alone_runs_whole_at_b1():
    engine = RecordingEngine()
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=8, chunk=16))
    long = Request("long", list(range(1, 60)), SamplingParams(max_tokens=2, stop_tokens=(), seed=1))
    short = Request("short", [5, 6], SamplingParams(max_tokens=2, stop_tokens=(), seed=2))
    scheduler.add(long)
    scheduler.add(short)
    scheduler.run()
    assert engine.calls[0] == ("serial", 1)  # flattening it alone would gain nothing
    for r in (long, short):
        assert scheduler.results[r.id].tokens == engine.expected_tokens(r.prompt_tokens, r.params)


def test_auto_falls_back_to_serial_without_varlen():
    rng = np.random.default_rng()
    requests = _requests(rng, 12)
    scheduler = Scheduler(FakeEngine(64), SchedulerConfig(max_batch=4))
    for r in requests:
        scheduler.add(r)
    scheduler.run()
    for r in requests:
        assert scheduler.results[r.id].tokens == reference_decode(FakeEngine(64), r.prompt_tokens, r.params)


def test_prompts_sharing_a_system_prompt_compute_it_once_under_flattened_prefill():
    rng = np.random.default_rng()
    system = rng.integers(1, 64, 40).tolist()
    requests = [Request(f"p{i}", system + rng.integers(1, 64, int(rng.integers(1, 12))).tolist(),
                        SamplingParams(max_tokens=3, stop_tokens=(), seed=i)) for i in range(6)]
    for policy in ("auto", "varlen"):
        engine = RecordingEngine()
        scheduler = Scheduler(engine, SchedulerConfig(max_batch=8, chunk=64, prefill_policy=policy,
                                                      prefix_cache_bytes=1 << 20, prefix_block=32))
        for r in requests:
            scheduler.add(r)
        scheduler.run()
        assert (scheduler.stats.prefix_misses, scheduler.stats.prefix_hits) == (1, 5), policy
        assert scheduler.stats.prefill_tokens == sum(len(r.prompt_tokens) for r in requests) - 5 * 32
        for r in requests:
            assert scheduler.results[r.id].tokens == engine.expected_tokens(r.prompt_tokens, r.params)
