"""gpu_check.md from the results dict: the section table, each section's own table, the goals."""
from __future__ import annotations

import json


def _status(row: dict) -> str | None:
    """'error: ...' / 'skipped: ...' for a row that has no measurement, else None."""
    if "error" in row:
        return "error: " + row["error"].splitlines()[0][:160]
    if "skipped" in row:
        return "skipped: " + row["skipped"]
    return None


def _diff_cell(r: dict) -> str:
    return _status(r) or f"logits {r['logits']['max_abs_err']:.1e}, state {r['state']['max_abs_err']:.1e}"


def _parity_lines(p: dict) -> list:
    lines = ["| case | error vs reference | ok |", "|---|---|---|"]
    for r in p.get("kernels", []):
        lines.append(f"| {r['case']} | {_status(r) or format(r['max_abs_err'], '.2e')} | {r.get('ok')} |")
    for r in p.get("sparse", []):
        err = _status(r) or f"rel {r['rel_err']:.1e}, bit-identical {r['bit_identical']}"
        lines.append(f"| sparse {r['zero_fraction']:.0%} zeros M={r['rows']} | {err} | {r.get('ok')} |")
    for r in p.get("models", []):
        lines.append(f"| model {r['config']} B={r['B']} T={r['T']} {r['kernels']} vs {r['reference']} | "
                     f"{_diff_cell(r)} | {r.get('ok')} |")
    return lines


def _torch_lines(p: dict) -> list:
    lines = [f"torch device {p.get('device')}, Triton {p.get('triton')}, JAX {p.get('jax')}", "",
             "| case | pair | error | ok |", "|---|---|---|---|"]
    for c in p.get("cases", []):
        case = f"{c['config']} B={c['B']} T={c['T']}"
        lines += [f"| {case} | {_status(c)} | | False |"] if _status(c) else [
            f"| {case} | {r['kernels']} vs {r['reference']} | {_diff_cell(r)} | {r['ok']} |" for r in c["pairs"]]
    return lines


def _rows_lines(rows: list) -> list:
    lines = ["| model | kernels | B | T | tok/s | step ms | roofline fraction (HBM / compute) | launches | "
             "compile s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['model']} | {r['kernels']} | {r['B']} | {r['T']} |"
        if _status(r):
            lines.append(f"{head} {_status(r)} | | | | |")
            continue
        lines.append(f"{head} {r['tok_s']:,.0f} | {r['step_ms']:.3f} | {r['hbm_roofline_fraction']:.2f} / "
                     f"{r['compute_roofline_fraction']:.2f} | {r['launches']} | {r['compile_s']:.1f} |")
    return lines


def _engine_lines(rows: list) -> list:
    def cell(r):
        return _status(r) or (f"greedy {r['engine_step_greedy_ms']:.3f}, sampled {r['engine_step_sampled_ms']:.3f}, "
                              f"compile {r['engine_compile_s']:.1f} s")
    return ["", "Engine's whole decode step (forward + sampling), ms:", ""] + [
        f"- {r['kernels']} B={r['B']}: {cell(r)}" for r in rows]


def _kernel_lines(p: dict) -> list:
    lines = ["| case | pallas | xla | xla/pallas |", "|---|---|---|---|"]
    for r in p.get("rows", []):
        if "pallas_us" not in r:
            lines.append(f"| {r['case']} | {_status(r)} | | |")
            continue
        extra = (f" (value product: sparse {r['value_sparse_us']:.1f} vs dense {r['value_dense_xla_us']:.1f}, "
                 f"active {r['active_fraction']:.0%})" if "value_sparse_us" in r else "")
        lines.append(f"| {r['case']}{extra} | {r['pallas_us']:.1f} | {r['xla_us']:.1f} | {r['speedup']:.2f} |")
    return lines + ["", f"Measured sparse channel-mix threshold (largest M where the sparse value product "
                        f"wins): {p.get('measured_sparse_max_rows')}"]


def _prefill_lines(p: dict) -> list:
    lines = ["| kind | B (prompts) | T (tokens) | tok/s | step ms | binds | roofline fraction | "
             "FLOPs / 989 TFLOP/s spec |", "|---|---|---|---|---|---|---|---|"]
    for r in p.get("rows", []):
        head = f"| {r['kind']} | {r['B']} | {r['T']} |"
        if "tok_s" not in r:
            lines.append(f"{head} {r.get('skipped') or r.get('error', '')} | | | | |")
            continue
        lines.append(f"{head} {r['tok_s']:,.0f} | {r['step_ms']:.2f} | {r['binding']} | "
                     f"{r['roofline_fraction']:.2f} | {r['spec_compute_fraction']:.2f} |")
    return lines


def _quantized_lines(p: dict) -> list:
    lines = [f"- parity {r['case']}: {_status(r) or format(r['max_abs_err'], '.2e')} (ok {r.get('ok')})"
             for r in p.get("parity", [])] + ["", "| model | kernels | weights | B | tok/s | step ms | HBM roofline fraction (quantized bytes) | "
             "params GB | compile s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in p.get("rows", []):
        head = f"| {r['model']} | {r['kernels']} | {r['quantization']} | {r['B']} |"
        lines.append(f"{head} {_status(r)} | | | | |" if _status(r) else
                     f"{head} {r['tok_s']:,.0f} | {r['step_ms']:.3f} | {r['hbm_roofline_fraction']:.2f} | "
                     f"{r['params_bytes'] / 1e9:.2f} | {r['compile_s']:.1f} |")
    return lines


def markdown(results: dict) -> str:
    env, sections = results["environment"], results["sections"]
    lines = [f"# GPU check — {env['date_utc']}", "",
             f"devices: {', '.join(env['devices'])}; versions: "
             + ", ".join(f"{k} {v}" for k, v in env["versions"].items()), "",
             "| section | status | seconds | reason |", "|---|---|---|---|"]
    lines += [f"| {name} | {p['status']} | {p.get('seconds', '')} | {p.get('reason') or p.get('error', '')} |"
              for name, p in sections.items()]
    tables = {"parity": _parity_lines, "torch_parity": _torch_lines, "kernels": _kernel_lines,
              "decode": lambda p: _rows_lines(p.get("rows", [])) + _engine_lines(p.get("engine", [])),
              "models": lambda p: _rows_lines(p.get("rows", [])), "prefill": _prefill_lines,
              "quantized": _quantized_lines, "state_dtype": lambda p: _rows_lines([p])}
    for name, p in sections.items():
        if p["status"] == "skipped":  # the table above says why
            continue
        lines += ["", f"## {name}: {p['status']}", ""]
        if name == "roofline" and "copy_GBps" in p:
            lines.append(f"copy {p['copy_GBps']:.4g} GB/s, bf16 matmul {p['bf16_matmul_TFLOPs']:.4g} TFLOP/s")
        elif name in tables:
            lines += tables[name](p)
        else:
            lines += ["```", json.dumps(p, indent=1, default=str)[:4000], "```"]
    s = results["summary"]
    lines += ["", "## Goals", ""] + [f"- {k}: {'not measured' if v is None else f'{v:.3g}'}"
                                    for k, v in s["goals"].items()]
    lines += [f"- per launch (pallas vs pallas-fused) at B={B}: {us:.2f} us" for B, us in s["per_launch_us"].items()]
    lines += [f"- estimate {r['model']} {r['kernels']} B={r['B']} T={r['T']}: measured {r['measured_us']:.0f} us vs "
              f"estimated {r['estimated_us']:.0f} us (x{r['measured_over_estimate']:.2f})" for r in s["estimate_check"]]
    return "\n".join(lines) + "\n"
