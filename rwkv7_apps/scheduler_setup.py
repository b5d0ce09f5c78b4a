"""The scheduler of a command (rwkv7-generate, rwkv7-serve): one Scheduler, a ReplicaSet
over the local devices (``--data-parallel``), or Ray actors (``--ray``), all driven
through ``scheduler.interface.SchedulerInterface``."""
from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any, Callable, NoReturn

from rwkv7_core.tokenizer import tokenizer_for
from scheduler import Scheduler
from scheduler.interface import SchedulerInterface
from scheduler.replicas.build import build_replica_set, engine_device
from scheduler.replicas.engine_guard import EngineGuard, Fault
from scheduler.replicas.ray_cluster import ray_replica_set

from .engines import load_engine, load_engines, load_node_engine, replica_devices
from .options import scheduler_config

EXIT_BAD_ARGS = 2


def build_scheduler(parser: argparse.ArgumentParser, args, model_path: Path,
                    prefix_store: Callable[[Any], Any] = lambda engine: None) -> SchedulerInterface:
    """The scheduler of ``args`` (``--data-parallel``, ``--ray``, the engine and scheduler
    options); ``prefix_store(engine)`` gives the prefix cache's disk tier (or None). Exits 2
    with a clear message (``parser.prog``) when the model or an option does not work; an
    injected fault (``RWKV7_REPLICA_FAULT``, tests only) goes into its replica."""
    def fail(message: str) -> NoReturn:
        parser.exit(EXIT_BAD_ARGS, f"{parser.prog}: error: {message}\n")

    if getattr(args, "ray", None):
        load = functools.partial(load_node_engine, args.backend, None if args.random_model else str(model_path),
                                 args.random_model, args.dtype, args.kernels, args.quantization, args.group_size,
                                 args.state_dtype)
        try:
            return ray_replica_set(args.ray, args.data_parallel, load, scheduler_config(args))
        except (OSError, ValueError) as e:
            fail(f"--ray {args.ray}: {e}")
    try:
        devices = replica_devices(args.backend, args.data_parallel)
    except ValueError as e:
        parser.error(str(e))
    try:
        engines = ([load_engine(args.backend, model_path, args.dtype, args.kernels, quantization=args.quantization,
                                group_size=args.group_size, state_dtype=args.state_dtype)]
                   if len(devices) == 1 else
                   load_engines(args.backend, model_path, args.dtype, args.kernels, devices, args.quantization,
                                args.group_size, args.state_dtype))
        tokenizer = tokenizer_for(engines[0].vocab_size, model_path)
    except (OSError, ValueError) as e:
        fail(f"cannot load model {model_path}: {e}")
    store = prefix_store(engines[0])
    try:  # ValueError: e.g. a prefill policy this backend does not support, a bad fault
        fault = Fault.from_env()
        if len(engines) == 1:
            engine = engines[0] if fault is None else EngineGuard(engines[0], fault.of_replica(0))
            return Scheduler(engine, scheduler_config(args), tokenizer=tokenizer, prefix_store=store)
        return build_replica_set(engines, [engine_device(e) for e in engines], scheduler_config(args), tokenizer,
                                 fault, prefix_store=store)
    except ValueError as e:
        fail(str(e))
