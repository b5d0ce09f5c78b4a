"""benchmarks/gpu_check.py's full (GPU) schedule, simulated on a CPU: the decode and models
sections (and prefill) run their real item lists and budget checks with every compile taking its recorded
deviceless time (RECORDED_COMPILE_S) on a simulated clock; the run must end within 8 minutes
and keep the priorities: all of pallas-fused / pallas decode, xla at B=1 and 8, then the
slow XLA compiles only if they fit, the bfloat16-state B=256 row, then the quantized 1.5b
int4 B=1 row; prefill and models get what is left."""
from __future__ import annotations

import types

from benchmarks.gpu_checks import decode, kernel_times, models, prefill, quantized, schedule
from rwkv7_core.config import named_config

NAMES = {named_config(n): n for n in ("1.5b", "2.9b")}
ROOFLINE = {"copy_GBps": 4800.0, "bf16_matmul_TFLOPs": 600.0}
BEFORE_DECODE_S = 10 + 64 + 5  # start-up, parity, roofline: docs/kernels-and-gpu-free-compile.md's estimates


def test_cold_run_at_the_recorded_compile_speed_ends_within_8_minutes(monkeypatch):
    now = [BEFORE_DECODE_S]

    def measure_model(model, B, T, smoke, roofline):
        config, kernels = model
        compile_s = schedule.CompileClock.recorded(NAMES[config], kernels, B, T) or schedule.FIRST_COMPILE_GUESS_S
        now[0] += compile_s + 2  # + the timed steps
        return {"compile_s": compile_s, "step_ms": 1.0, "tok_s": B * T * 1e3, "launches": 1}

    def measure_engine_step(model, B, smoke):
        now[0] += 13 + 1
        return {"engine_step_greedy_ms": 1.0, "engine_step_sampled_ms": 1.0}

    monkeypatch.setattr(schedule, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    for module in (decode, prefill):
        monkeypatch.setattr(module, "model_for", lambda config, dtype, kernels, device=None, **_: (config, kernels))
    monkeypatch.setattr(decode, "measure_model", measure_model)
    monkeypatch.setattr(decode, "measure_engine_step", measure_engine_step)

    def measure_prefill(model, B, T, *args):
        compile_s = schedule.PREFILL_COMPILE_S[next(k for k in schedule.PREFILL_COMPILE_S if k[1:] == (B, T))]
        now[0] += compile_s + 5
        return {"compile_s": compile_s, "step_ms": 1.0, "tok_s": 1.0}

    monkeypatch.setattr(prefill, "measure_dense_prefill", measure_prefill)
    monkeypatch.setattr(prefill, "measure_varlen_prefill", lambda model, lengths, T, *a: measure_prefill(model, 64, T))
    monkeypatch.setattr(quantized, "quantized_parity", lambda interpret, smoke: now.__setitem__(0, now[0] + 8) or [])
    monkeypatch.setattr(quantized, "measure_quantized", lambda config, dtype, kernels, scheme, B, smoke, roofline:
                        measure_model((config, f"{kernels} {scheme}"), B, 1, smoke, roofline))
    budget, clock = schedule.Budget(schedule.TOTAL_BUDGET_S, start=0.0), schedule.CompileClock()
    *_, decoded = decode.run_decode(False, False, ROOFLINE, budget, clock)
    state_dtype = decode.run_state_dtype(False, False, ROOFLINE, budget, clock)
    now[0] += schedule.DEVICELESS_S
    *_, quantized_rows = quantized.run_quantized(False, False, ROOFLINE, budget, clock)
    *_, prefilled = prefill.run_prefill(False, False, ROOFLINE, budget, clock)
    *_, other = models.run_models(False, False, ROOFLINE, budget, clock)
    assert now[0] <= 8 * 60 - 30, now[0]
    ran = {(r["kernels"], r["B"]) for r in decoded["rows"] if "tok_s" in r}
    assert ran == {(k, B) for k in ("pallas-fused", "pallas") for B in schedule.DECODE_BATCHES} | {("xla", 1), ("xla", 8)}
    assert all("engine_step_sampled_ms" in r for r in decoded["engine"])
    assert "tok_s" in state_dtype and state_dtype["state_dtype"] == "bfloat16"
    assert all(r["skipped"].startswith("time budget")
               for r in decoded["rows"] + quantized_rows["rows"] + prefilled["rows"] + other["rows"] if "tok_s" not in r)
    # after the bfloat16-state row the quantized 1.5b int4 B=1 row fits; at the recorded compile
    # speed the prefill and models sections then start nothing (a rerun with --cache-dir reaches
    # them, int8 and fp8)
    assert {(r["model"], r["quantization"], r["B"]) for r in quantized_rows["rows"] if "tok_s" in r} == {
        ("1.5b", "int4", 1)}
    assert not [r for r in prefilled["rows"] + other["rows"] if "tok_s" in r]


def test_sparse_threshold_is_the_largest_winning_row_count():
    rows = [{"case": f"channel_mix M={m}", "value_sparse_us": s, "value_dense_xla_us": 10.0}
            for m, s in ((1, 5.0), (2, 9.0), (4, 12.0), (8, 30.0))] + [{"case": "linear M=1"}]
    assert kernel_times.sparse_rows_threshold(rows) == 2
    assert kernel_times.sparse_rows_threshold(rows[2:]) == 0
    assert kernel_times.sparse_rows_threshold([]) is None
