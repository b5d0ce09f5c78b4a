"""Framework-agnostic batch scheduler for recurrent LMs (imports numpy only).

    from scheduler import SamplingParams, Request, Scheduler, SchedulerConfig, generate
    outputs = generate(engine, [Request("a", [1, 2, 3], SamplingParams(max_tokens=8))])

Engines (``rwkv_jax.engine.JaxEngine``, ``rwkv_torch_ref.engine.TorchEngine``) implement the
``Engine`` protocol of ``scheduler.engine``; the scheduler never sees the model.
"""
from .api import generate
from .config import PrefillPolicy, SchedulerConfig, bucket_ladder
from .core import Scheduler
from .engine import NONFINITE_TOKEN, Engine
from .params import RequestOutput, Request, RequestState, SamplingParams
from .stats import Stats

__all__ = ["Engine", "NONFINITE_TOKEN", "PrefillPolicy", "Request", "RequestOutput", "RequestState",
           "SamplingParams", "Scheduler", "SchedulerConfig", "Stats", "bucket_ladder", "generate"]
