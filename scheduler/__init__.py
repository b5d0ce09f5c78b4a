"""Framework-agnostic batch scheduler for recurrent LMs (numpy and rwkv7_core only).

    from scheduler import SamplingParams, Request, Scheduler, SchedulerConfig, generate
    outputs = generate(engine, [Request("a", [1, 2, 3], SamplingParams(max_tokens=8))])

Engines (``rwkv_jax.engine.JaxEngine``, ``rwkv_torch_ref.engine.TorchEngine``) implement the
engine contract of ``rwkv7_core.engine``; the scheduler never sees the model.
"""
from rwkv7_core.engine import Engine
from rwkv7_core.sampling import NONFINITE_TOKEN, SamplingParams

from .api import generate
from .config import PrefillPolicy, SchedulerConfig, bucket_ladder
from .core import Scheduler
from .errors import ErrorCode, FinishReason
from .interface import SchedulerFailed
from .request import Request, RequestOutput, RequestState
from .stats import Stats

__all__ = ["Engine", "ErrorCode", "FinishReason", "NONFINITE_TOKEN", "PrefillPolicy", "Request", "RequestOutput", "RequestState",
           "SamplingParams", "Scheduler", "SchedulerConfig", "SchedulerFailed", "Stats", "bucket_ladder",
           "generate"]
