"""Engine capabilities survive the replica layer: they are declared (``Engine.capabilities``)
and read through EngineGuard, not inferred with ``isinstance`` (which, since Python 3.12, does
not see attributes an ``__getattr__`` forwards). Two guarded JaxEngines (tiny model,
in-process) under every prefill policy, with and without logprobs, draw the tokens one
engine draws alone, and each replica runs the requested policy's prefill calls (auto
flattens: varlen calls); an engine whose declaration lies is refused in one line."""
from __future__ import annotations

import numpy as np
import pytest

from rwkv7_core.engine import Capability
from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig
from scheduler.replicas.build import build_replica_set
from tests.support.scheduler_engines import FakeEngine

POLICIES = ("serial", "varlen", "mixed", "auto")
CALLS = {"serial": {"serial"}, "varlen": {"varlen"}, "mixed": {"mixed"}}
"""The prefill call kinds each fixed policy runs (auto: varlen, and serial when one prompt waits)."""


@pytest.fixture(scope="module")
def engines(tiny_ckpt):
    import rwkv_jax
    from rwkv_jax.engine import JaxEngine

    model = rwkv_jax.load(tiny_ckpt.with_suffix(".safetensors"), dtype="float32", kernels="xla")
    return [JaxEngine(model, prefill_pieces=(16, 4, 1)) for _ in range(2)]


def _config(policy: str) -> SchedulerConfig:
    return SchedulerConfig(max_batch=4, buckets=(1, 2, 4), prefill_policy=policy, chunk=32)


def _requests(logprobs: int | None) -> list[Request]:
    """16 fresh random greedy requests; prompts of 1..12 tokens, so the first prefill call of
    each replica finds several prompts queued."""
    rng = np.random.default_rng()
    return [Request(f"r{i}", rng.integers(1, 512, int(rng.integers(1, 13))).tolist(),
                    SamplingParams(max_tokens=int(rng.integers(1, 9)), stop_tokens=(), logprobs=logprobs))
            for i in range(16)]


def _outcomes(outputs) -> dict[str, tuple]:
    return {o.id: (o.finish_reason, o.tokens) for o in outputs}


@pytest.mark.parametrize("logprobs", [None, 3])
@pytest.mark.parametrize("policy", POLICIES)
def test_replicas_keep_every_capability(engines, policy, logprobs):
    requests = _requests(logprobs)
    single = Scheduler(engines[0], _config(policy))
    for r in requests:
        single.add(r)
    single.run()
    rset = build_replica_set(engines, ["a", "b"], _config(policy))
    outputs = []
    for r in requests:
        rset.add(r)
    rset.run(on_finish=outputs.append)

    assert _outcomes(outputs) == _outcomes(single.results.values())
    refused = logprobs is not None and policy == "mixed"  # logprobs need a serial or varlen prefill
    max_tokens = {r.id: r.params.max_tokens for r in requests}
    for o in [*outputs, *single.results.values()]:
        if refused:
            assert o.finish_reason == "error" and "logprobs need" in o.error, o
        else:
            assert o.finish_reason == "length" and len(o.tokens) == max_tokens[o.id], o
    assert all(r.requests > 0 for r in rset.replicas)
    for replica in rset.replicas:
        kinds = set(replica.scheduler.stats.prefill_calls)
        if refused:
            assert not kinds
        elif policy == "auto":
            assert "varlen" in kinds and kinds <= {"serial", "varlen"}, kinds
        else:
            assert kinds == CALLS[policy], kinds


class DeclaresVarlenWithoutIt(FakeEngine):
    capabilities = frozenset({Capability.VARLEN_PREFILL})


def test_a_lying_declaration_is_refused_in_one_line():
    message = "DeclaresVarlenWithoutIt declares Capability.VARLEN_PREFILL but has no method prefill_varlen()"
    with pytest.raises(TypeError) as plain:
        Scheduler(DeclaresVarlenWithoutIt(), SchedulerConfig(prefill_policy="serial"))
    with pytest.raises(TypeError) as replicated:
        build_replica_set([FakeEngine(), DeclaresVarlenWithoutIt()], ["a", "b"], SchedulerConfig())
    assert str(plain.value) == str(replicated.value) == message


def test_capabilities_must_be_a_frozenset_of_capability():
    class Undeclared(FakeEngine):
        capabilities = {"varlen_prefill"}

    with pytest.raises(TypeError, match="Undeclared.capabilities must be a frozenset of Capability"):
        Scheduler(Undeclared())
