"""The run's time plan: each section's budget, the items' shapes, and the recorded deviceless
compile seconds the decode / models / quantized / prefill items are planned by (a ``Budget``
says whether an item may start; a ``CompileClock`` scales the recorded compile seconds by
the slowest measured/recorded ratio so far)."""
from __future__ import annotations

import math
import time

import numpy as np

TOTAL_BUDGET_S = 450          # whole run from the imports on: 30 s margin under 8 minutes
PARITY_BUDGET_S = 150         # parity items stop starting after this long
TORCH_WAIT_S = 60             # the torch child's answer is awaited this long after parity
KERNEL_BUDGET_S = 90          # per-kernel timings stop starting new cases after this long
SERVING_BUDGET_S = 180        # at most, for rwkv7_apps.tools.serving_bench.gpu_check_section
HTTP_BUDGET_S = 120           # at most, for benchmarks/http_serving.gpu_check_section
SECTION_MIN_S = 60            # serving / HTTP / data-parallel start only with this much left
DEVICELESS_S = 15             # expected seconds of the deviceless section
FIRST_COMPILE_GUESS_S = 60    # compile estimate of a shape with no recorded compile
DECODE_BATCHES = (1, 8, 32, 256)
QUANTIZED_BUDGET_S = 60       # quantized rows stop starting after this long
PREFILL_T = 1024
VARLEN_LENGTHS = tuple(int(n) for n in np.random.default_rng(0).multinomial(4096 - 64, [1 / 64] * 64) + 1)
PREFILL_ITEMS = (("dense", 1, PREFILL_T), ("varlen", 64, 4096), ("dense", 32, PREFILL_T))  # cheapest first
# Deviceless 1.5b pallas prefill compiles, scaled like RECORDED_COMPILE_S's 1x1024 (44.5 s) by
# their ratios in benchmarks/results/chunked_wkv_prefill_h200.md (69.6 / 114.2 / 85.6 s)
PREFILL_COMPILE_S = {("dense", 1, PREFILL_T): 44.5, ("varlen", 64, 4096): 73.0, ("dense", 32, PREFILL_T): 54.7}
# Deviceless H200 compile seconds of the bf16 forward on a 2-core CPU, (shape, kernels, B, T):
# decode rows of benchmarks/results/decode_nodes.json (pallas-fused "after", pallas/xla
# "before"); the 1.5b pallas prefill is gpu_compile_h200.json's 164.7 s (machine load ~15)
# over 3.7, its ratio to decode_nodes.json on their common row (1.5b pallas B=1).
DECODE_RECORDED_COMPILE_S = {
    ("1.5b", "pallas-fused", 1, 1): 13.4, ("1.5b", "pallas-fused", 2, 1): 14.5,
    ("1.5b", "pallas-fused", 8, 1): 14.2, ("1.5b", "pallas-fused", 32, 1): 14.6,
    ("1.5b", "pallas-fused", 256, 1): 11.2, ("1.5b", "pallas", 1, 1): 12.7, ("1.5b", "pallas", 8, 1): 18.2,
    ("1.5b", "pallas", 32, 1): 12.5, ("1.5b", "pallas", 256, 1): 11.1, ("1.5b", "pallas", 1, PREFILL_T): 44.5,
    ("1.5b", "xla", 1, 1): 26.0, ("1.5b", "xla", 8, 1): 94.5, ("1.5b", "xla", 32, 1): 198.5,
    ("1.5b", "xla", 256, 1): 484.5, ("2.9b", "pallas-fused", 1, 1): 43.3, ("2.9b", "pallas-fused", 8, 1): 58.2,
    ("2.9b", "pallas-fused", 32, 1): 63.6, ("2.9b", "pallas-fused", 256, 1): 50.1,
    ("2.9b", "pallas", 1, 1): 125.9, ("2.9b", "pallas", 8, 1): 129.7, ("2.9b", "xla", 1, 1): 54.6,
    ("2.9b", "xla", 8, 1): 280.7,
}
# The quantized 1.5b decode step (kernels named "<kernels> <scheme>"): the bf16 step's recorded
# compile plus ~20 % (deviceless runs of benchmarks/quant_decode_kernels.py).
QUANTIZED_RECORDED_COMPILE_S = {
    ("1.5b", "pallas-fused int8", 1, 1): 16.0, ("1.5b", "pallas-fused fp8", 1, 1): 16.0,
    ("1.5b", "pallas int8", 1, 1): 16.0, ("1.5b", "pallas fp8", 1, 1): 16.0,
    ("1.5b", "pallas-fused int4", 1, 1): 16.0, ("1.5b", "pallas int4", 1, 1): 16.0,
}
RECORDED_COMPILE_S = {**DECODE_RECORDED_COMPILE_S, **QUANTIZED_RECORDED_COMPILE_S}


class Budget:
    """Wall-clock budget counted from ``start``."""

    def __init__(self, total_s: float, start: float | None = None):
        self.start, self.total_s = time.perf_counter() if start is None else start, total_s

    def left(self) -> float:
        return self.total_s - (time.perf_counter() - self.start)

    def capped(self, cap_s: float) -> "Budget":
        """A budget from now: cap_s or what is left, whichever is less (no cap when unlimited)."""
        return Budget(self.left() if math.isinf(self.total_s) else min(cap_s, self.left()))

    def shortfall(self, need_s: float) -> str | None:
        """Why an item needing need_s seconds must not start, or None if it fits."""
        left = self.left()
        return None if left >= need_s else f"time budget: needs ~{need_s:.0f} s, {max(left, 0):.0f} s left"


class CompileClock:
    """Compile-time estimates: RECORDED_COMPILE_S (else the largest recorded for the shape and
    kernels, else FIRST_COMPILE_GUESS_S) times the slowest measured/recorded ratio so far."""

    def __init__(self):
        self.ratios = []

    @staticmethod
    def recorded(name, kernels, B, T) -> float | None:
        same = [s for (n, k, _, _), s in RECORDED_COMPILE_S.items() if (n, k) == (name, kernels)]
        return RECORDED_COMPILE_S.get((name, kernels, B, T), max(same, default=None))

    def estimate(self, name, kernels, B, T) -> float:
        base = self.recorded(name, kernels, B, T) or FIRST_COMPILE_GUESS_S
        return base * max(self.ratios, default=1.0)

    def measured(self, name, kernels, B, T, seconds: float) -> None:
        if (name, kernels, B, T) in RECORDED_COMPILE_S:
            self.ratios.append(seconds / RECORDED_COMPILE_S[(name, kernels, B, T)])
