"""One scheduler interface (scheduler/interface.py): the single Scheduler, the replica set and
the Ray replica set have every method of it, with its parameters, and the first two serve
every one of them (tests/rwkv7_apps/test_data_parallel_ray.py exercises the Ray set); the real HTTP server (uvicorn on a free
loopback port, in this process) serves n choices and echoed prompt logprobs from a set of
two replicas (torch, tiny model)."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig
from scheduler.interface import SchedulerInterface
from scheduler.replicas.build import build_replica_set
from scheduler.replicas.ray_cluster import ActorScheduler, RayReplicaSet
from scheduler.replicas.replica_set import ReplicaSet
from tests.rwkv7_apps.interface_check import exercise_interface
from tests.rwkv7_apps.serve_harness import in_process_server

METHODS = [n for n, v in vars(SchedulerInterface).items() if inspect.isfunction(v) and not n.startswith("_")]
ATTRIBUTES = ["config", "tokenizer", "results", "engine", "stats", "logprobs_unsupported"]


def _parameters(function) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p != "self"]


@pytest.mark.parametrize("implementation", [Scheduler, ReplicaSet, RayReplicaSet, ActorScheduler])
def test_each_implementation_has_every_method_of_the_interface(implementation):
    assert {"add", "add_group", "cancel", "score", "queue_sizes", "precompile", "run"} <= set(METHODS)
    for name in METHODS:
        method = inspect.getattr_static(implementation, name, None)
        assert inspect.isfunction(method), f"{implementation.__name__} lacks {name}"
        assert _parameters(method) == _parameters(getattr(SchedulerInterface, name)), (implementation, name)


def test_each_implementation_serves_every_member_of_the_interface(tiny_ckpt):
    from rwkv7_apps.engines import load_engine

    engines = [load_engine("torch", tiny_ckpt, kernels="torch") for _ in range(2)]
    config = SchedulerConfig(max_batch=4)
    for sched in (Scheduler(engines[0], config), build_replica_set(engines, ["a", "b"], config)):
        for name in ATTRIBUTES:
            assert hasattr(sched, name), (type(sched).__name__, name)
        exercise_interface(sched)


@pytest.fixture(scope="module")
def replica_server(tiny_ckpt):
    """A real server over two torch replicas; yields (OpenAI client, one bare engine)."""
    openai = pytest.importorskip("openai")
    from rwkv7_apps.engines import load_engine
    from rwkv7_apps.serve.cli import build_app
    from rwkv7_apps.serve.job import Limits

    engines = [load_engine("torch", tiny_ckpt, kernels="torch") for _ in range(2)]
    rset = build_replica_set(engines, ["cpu-a", "cpu-b"], SchedulerConfig(max_batch=4))
    app, service = build_app(rset, "m", {"max_tokens": 8}, Limits(64, 16), lambda: True)
    with in_process_server(app, service) as url:
        yield openai.OpenAI(base_url=url, api_key="x", max_retries=0), engines[0]


def test_replica_server_gives_n_choices_each_equal_to_its_seed_alone(replica_server):
    client, engine = replica_server
    rng = np.random.default_rng()
    prompt = rng.integers(1, 512, int(rng.integers(2, 10))).tolist()
    seed = int(rng.integers(2**31))
    answer = client.completions.create(model="m", prompt=prompt, n=2, max_tokens=6, temperature=1.0, seed=seed,
                                       extra_body={"stop_token_ids": [], "return_token_ids": True})
    got = {c.index: c.model_extra["token_ids"] for c in answer.choices}
    alone = Scheduler(engine, SchedulerConfig(max_batch=4))
    for i in range(2):
        alone.add(Request(f"alone{i}", prompt, SamplingParams(max_tokens=6, temperature=1.0, stop_tokens=(),
                                                              seed=seed + i)))
    alone.run()
    assert got == {i: alone.results[f"alone{i}"].tokens for i in range(2)}


def test_replica_server_echoes_the_prompts_own_logprobs(replica_server):
    client, engine = replica_server
    prompt = np.random.default_rng().integers(1, 512, 7).tolist()
    answer = client.completions.create(model="m", prompt=prompt, max_tokens=1, echo=True, logprobs=2,
                                       extra_body={"stop_token_ids": []})
    echoed = answer.choices[0].logprobs.token_logprobs[:len(prompt)]
    scored = engine.prompt_logprobs(np.asarray(prompt, np.int32))
    assert echoed[0] is None
    np.testing.assert_allclose(echoed[1:], np.asarray(scored.chosen, np.float64).ravel(), rtol=1e-4, atol=1e-5)
