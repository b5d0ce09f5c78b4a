"""The scheduler of a command (rwkv7-generate, rwkv7-serve): one Scheduler, a ReplicaSet
over the local devices (``--data-parallel``), or Ray actors (``--ray``), all driven
through ``scheduler.interface.SchedulerInterface``."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from rwkv7_core.tokenizer import tokenizer_for
from scheduler.interface import SchedulerInterface

from .engines import engine_device, load_engine, load_engines, replica_devices
from .options import scheduler_config

EXIT_BAD_ARGS = 2


def build_scheduler(parser: argparse.ArgumentParser, args, model_path: Path,
                    prefix_store: Callable[[object], object] = lambda engine: None) -> SchedulerInterface:
    """The scheduler of ``args`` (``--data-parallel``, ``--ray``, the engine and scheduler
    options); ``prefix_store(engine)`` gives the prefix cache's disk tier (or None). Exits 2
    with a clear message (``parser.prog``) when the model or an option does not work; an
    injected fault (``RWKV7_REPLICA_FAULT``, tests only) goes into its replica."""
    from scheduler import Scheduler

    from .engine_guard import EngineGuard, Fault
    from .replicas import build_replica_set

    def fail(message: str):
        parser.exit(EXIT_BAD_ARGS, f"{parser.prog}: error: {message}\n")

    if getattr(args, "ray", None):
        from .ray_replicas import ray_replica_set
        try:
            return ray_replica_set(args, model_path, scheduler_config(args))
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
    except (OSError, ValueError) as e:
        fail(f"cannot load model {model_path}: {e}")
    tokenizer = tokenizer_for(engines[0].vocab_size, model_path)
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
