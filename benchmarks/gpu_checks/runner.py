"""gpu_check's command line and the order of its sections (``main``); benchmarks/gpu_check.py
starts the clock and calls it."""
from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path as FsPath

import jax

import rwkv_jax
from benchmarks.gpu_check_mosaic import run_mosaic
from benchmarks.gpu_checks.data_parallel import run_data_parallel
from benchmarks.gpu_checks.decode import mosaic_decode_row, run_decode, run_state_dtype
from benchmarks.gpu_checks.deviceless import run_deviceless
from benchmarks.gpu_checks.kernel_times import run_kernel_times
from benchmarks.gpu_checks.models import run_models
from benchmarks.gpu_checks.parity import run_parity
from benchmarks.gpu_checks.prefill import run_prefill
from benchmarks.gpu_checks.quantized import run_quantized
from benchmarks.gpu_checks.report import Report, environment
from benchmarks.gpu_checks.roofline import run_roofline
from benchmarks.gpu_checks.schedule import TORCH_WAIT_S, TOTAL_BUDGET_S, Budget, CompileClock
from benchmarks.gpu_checks.serving import run_http_serving, run_serving
from benchmarks.gpu_checks.torch_parity import collect_torch_parity, run_torch_parity, start_torch_parity


def main(argv=None, start: float | None = None) -> dict:
    """Runs the sections in order (or, with --torch-parity, that section alone as JSON on
    stdout) and returns the results; ``start`` is when the run's clock started (now if None)."""
    start = time.perf_counter() if start is None else start
    ap = argparse.ArgumentParser(description="First GPU run: kernel parity, decode speed, the rest (issue 4)")
    ap.add_argument("--out", default="benchmarks/results/", help="directory for gpu_check.json/.md")
    ap.add_argument("--smoke", action="store_true", help="CPU run with tiny shapes and interpret-mode kernels")
    ap.add_argument("--cache-dir", default=None,
                    help="persistent JAX compilation cache (a rerun on the same machine skips compiles)")
    ap.add_argument("--torch-parity", action="store_true",
                    help="only the torch parity, printed as JSON (the child process of that section)")
    args = ap.parse_args(argv)
    if args.torch_parity:
        print(json.dumps(run_torch_parity(args.smoke), default=str))
        return {}
    if not args.smoke and jax.default_backend() != "gpu":
        raise SystemExit(f"gpu_check needs a GPU (backend is {jax.default_backend()!r}); use --smoke on a CPU")
    child = start_torch_parity(args.smoke)  # runs beside the JAX parity
    budget = Budget(float("inf") if args.smoke else TOTAL_BUDGET_S, start)  # --smoke: CI load must not skip pieces
    if args.cache_dir:
        rwkv_jax.enable_compilation_cache(args.cache_dir)
    out_dir = FsPath(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    interpret, clock = args.smoke, CompileClock()
    report = Report(out_dir, start, {"environment": environment(), "smoke": args.smoke, "interpret": interpret,
                              "budget_s": None if args.smoke else TOTAL_BUDGET_S})
    report.section("parity", run_parity, args.smoke, interpret, budget)
    report.section("torch_parity", collect_torch_parity, child, min(TORCH_WAIT_S, budget.left()))
    roofline = report.section("roofline", run_roofline, args.smoke)
    mosaic_row = functools.partial(mosaic_decode_row, smoke=args.smoke, roofline=roofline, budget=budget, clock=clock)
    report.section("mosaic", run_mosaic, args.smoke, interpret, mosaic_row)
    report.section("decode", run_decode, args.smoke, interpret, roofline, budget, clock)
    report.section("state_dtype", run_state_dtype, args.smoke, interpret, roofline, budget, clock)
    report.section("deviceless", run_deviceless, args.smoke, budget)
    report.section("quantized", run_quantized, args.smoke, interpret, roofline, budget, clock)
    report.section("prefill", run_prefill, args.smoke, interpret, roofline, budget, clock)
    report.section("models", run_models, args.smoke, interpret, roofline, budget, clock)
    report.section("kernels", run_kernel_times, args.smoke, interpret, budget)
    report.section("serving", run_serving, args.smoke, str(out_dir), budget)
    report.section("http_serving", run_http_serving, args.smoke, str(out_dir), budget)
    report.section("data_parallel", run_data_parallel, args.smoke, budget)
    report.results["elapsed_s"] = time.perf_counter() - start
    report.save()
    print((out_dir / "gpu_check.md").read_text())
    return report.results
