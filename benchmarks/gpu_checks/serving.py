"""Sections serving and http_serving: the serving benchmarks' short GPU runs within what is
left of the budget (not run in --smoke)."""
from __future__ import annotations

from benchmarks import http_serving
from benchmarks.gpu_checks.common import skipped
from benchmarks.gpu_checks.schedule import HTTP_BUDGET_S, SECTION_MIN_S, SERVING_BUDGET_S, Budget
from rwkv7_apps.tools import serving_bench


def run_serving(smoke: bool, out_dir: str, budget: Budget) -> dict:
    """rwkv7_apps.tools.serving_bench.gpu_check_section(out_dir, budget_s) within the budget."""
    reason = "not run in --smoke" if smoke else budget.shortfall(SECTION_MIN_S)
    return skipped(reason) if reason else serving_bench.gpu_check_section(
        out_dir=out_dir, budget_s=min(SERVING_BUDGET_S, budget.left()))


def run_http_serving(smoke: bool, out_dir: str, budget: Budget) -> dict:
    """benchmarks/http_serving.py's short GPU run (rwkv7-serve vs in-process scheduler on the
    same workload) within the budget."""
    reason = "not run in --smoke" if smoke else budget.shortfall(SECTION_MIN_S)
    if reason:
        return skipped(reason)
    return http_serving.gpu_check_section(out_dir, min(HTTP_BUDGET_S, budget.left()))
