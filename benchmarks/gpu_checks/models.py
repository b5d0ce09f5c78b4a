"""Section models: the forward rows beyond the decode section (2.9b, prefill T=PREFILL_T,
the other decode buckets) in priority order, while the budget lasts."""
from __future__ import annotations

from benchmarks.gpu_checks.common import kernel_names
from benchmarks.gpu_checks.decode import model_row
from benchmarks.gpu_checks.schedule import DECODE_BATCHES, PREFILL_T, Budget, CompileClock


def model_items(smoke: bool, fused: str, pallas: str, xla: str) -> list:
    """(model name, kernels, B, T) beyond the decode section, in priority order."""
    if smoke:  # a shape the parity section compiled: the code path, no compile
        return [("tiny", xla, 1, 1)]
    items = [("2.9b", k, 1, 1) for k in (fused, pallas, xla)]
    items += [("1.5b", k, 1, PREFILL_T) for k in (pallas, xla)]
    items += [("2.9b", k, 256, 1) for k in (fused, pallas, xla)]
    items += [("2.9b", k, 1, PREFILL_T) for k in (pallas, xla)]
    return items + [(name, k, B, 1) for name in ("1.5b", "2.9b") for B in (2, 4, 8, 16, 32, 64, 128)
                    for k in (fused, pallas, xla) if (name, B) not in {("1.5b", b) for b in DECODE_BATCHES}]


def run_models(smoke: bool, interpret: bool, roofline: dict, budget: Budget, clock: CompileClock):
    """Decode/prefill rows of model_items while the budget lasts; yields after each item."""
    out = {"rows": []}
    for name, kernels, B, T in model_items(smoke, *kernel_names(interpret)):
        out["rows"].append(model_row(name, kernels, B, T, smoke, roofline, budget, clock))
        yield out
