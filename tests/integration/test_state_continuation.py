"""A conversation continued from a saved state file, on the JAX and torch engines (tiny
model, float32, greedy): turn 2 started from turn 1's final state (written with
``save_state``, read back with ``load_state``) gives exactly the tokens of running turn 1's
prompt + output + turn 2's prompt in one go, however turn 1 finished."""
import dataclasses

import numpy as np
import pytest

from rwkv7_core.engine import Capability
from rwkv7_core.state_files import from_host_row, load_state, save_state, to_host_row
from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig, generate
from scheduler.request import InitialState

V = 512


@pytest.fixture(scope="module", params=["jax", "torch"])
def engine(request, tiny_ckpt):
    if request.param == "jax":
        import rwkv_jax
        from rwkv_jax.engine import JaxEngine
        return JaxEngine(rwkv_jax.load(tiny_ckpt, dtype="float32"), prefill_pieces=(16, 1))
    import torch

    import rwkv_torch_ref
    from rwkv_torch_ref.engine import TorchEngine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    return TorchEngine(rwkv_torch_ref.load(tiny_ckpt, dtype="float32"))


def _greedy(max_tokens, stop_tokens=()):
    return SamplingParams(max_tokens=max_tokens, stop_tokens=tuple(stop_tokens))


def test_two_turns_from_a_state_file_equal_one_go(engine, tmp_path):
    config = engine.model.config
    policies = ["serial", "varlen"] if Capability.VARLEN_PREFILL in engine.capabilities else ["serial"]
    rng = np.random.default_rng()
    p1s = [rng.integers(1, V, int(n)).tolist() for n in rng.integers(3, 30, 4)]
    free = generate(engine, [Request(f"f{i}", p, _greedy(12)) for i, p in enumerate(p1s)], SchedulerConfig(max_batch=4))
    turn1 = [Request("length", p1s[0], _greedy(12), return_state=True),
             Request("stop_token", p1s[1], _greedy(12, [free[1].tokens[5]]), return_state=True),
             Request("first_token", p1s[2], _greedy(1), return_state=True),
             Request("prefill_only", p1s[3], _greedy(0), return_state=True)]
    for policy in policies:
        cfg = SchedulerConfig(max_batch=4, prefill_policy=policy, chunk=16, prefix_cache_bytes=64 << 20,
                              prefix_block=8)
        firsts = generate(engine, turn1, cfg)
        assert [o.finish_reason for o in firsts] == ["length", "stop", "length", "length"]
        assert firsts[1].tokens == free[1].tokens[:free[1].tokens.index(free[1].tokens[5])]
        p2 = rng.integers(1, V, 6).tolist()
        turn2, one_go = [], []
        for r, out in zip(turn1, firsts):
            path = tmp_path / f"{policy}-{r.id}.safetensors"
            consumed = len(r.prompt_tokens) + len(out.tokens)
            save_state(path, from_host_row(out.final_state, consumed, "float32"), config)
            state = load_state(path, config)
            assert state.tokens == consumed
            turn2.append(Request(r.id, p2, _greedy(10), initial_state=InitialState.of(to_host_row(state))))
            one_go.append(Request(r.id, list(r.prompt_tokens) + out.tokens + p2, _greedy(10)))
        again = [dataclasses.replace(r, id=r.id + "-again") for r in turn2]  # hits the prefix cache
        continued = generate(engine, turn2 + again, cfg)
        expected = generate(engine, one_go, SchedulerConfig(max_batch=4))
        assert [o.tokens for o in continued] == [o.tokens for o in expected] * 2, policy
        assert all(len(o.tokens) == 10 for o in expected)


def test_next_turn_from_the_turn_cache_equals_one_go(engine):
    """A scheduler with a prefix cache keeps each finished request's state (``turn_cache``):
    the next turn (prompt + output + new tokens) prefills only the new part, and draws
    exactly what a cold prefill of the whole prompt draws."""
    rng = np.random.default_rng()
    p1s = [rng.integers(1, V, int(n)).tolist() for n in rng.integers(3, 30, 2)]
    free = generate(engine, [Request(f"f{i}", p, _greedy(12)) for i, p in enumerate(p1s)], SchedulerConfig(max_batch=2))
    stop = next(t for t in free[1].tokens[5:] + free[1].tokens[1:5] if t != free[1].tokens[0])
    consumed = free[1].tokens.index(stop)  # >= 1: its first draw ends the request, maybe before index 5
    turn1 = [Request("length", p1s[0], _greedy(12)), Request("stop_token", p1s[1], _greedy(12, [stop]))]
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=2, prefix_cache_bytes=64 << 20, prefix_block=8))
    for r in turn1:
        scheduler.add(r)
    scheduler.run()
    firsts = [scheduler.results.pop(r.id) for r in turn1]
    turn2 = [Request(r.id + "-2", list(r.prompt_tokens) + out.tokens + rng.integers(1, V, 7).tolist(), _greedy(10))
             for r, out in zip(turn1, firsts)]
    for r in turn2:
        scheduler.add(r)
    scheduler.run()
    seconds = [scheduler.results.pop(r.id) for r in turn2]
    assert [o.cached_tokens for o in seconds] == [len(p1s[0]) + 11, len(p1s[1]) + consumed]
    cold = generate(engine, turn2, SchedulerConfig(max_batch=2))
    assert [o.tokens for o in seconds] == [o.tokens for o in cold]
