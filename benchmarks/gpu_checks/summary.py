"""The report's summary from the rows measured so far: the issue's speed goals, the cost per
launch saved (pallas against pallas-fused), and the measured steps beside the deviceless
paper estimates."""
from __future__ import annotations

import functools
import json
from pathlib import Path as FsPath

ESTIMATES = FsPath(__file__).resolve().parents[1] / "results" / "gpu_compile_h200.json"

GOALS = {"pallas_over_xla_b1": 1.5, "b1_hbm_roofline_fraction": 0.7, "2.9b_b256_tok_s": 30000}


def measured_rows(sections: dict) -> list:
    """Every decode/models row with a measurement."""
    return [r for s in ("decode", "models") for r in sections.get(s, {}).get("rows", []) if "tok_s" in r]


def goals(rows: list) -> dict:
    """The issue's speed goals, evaluated on the measured rows (None where not measured); the
    Pallas side is the faster of "pallas" and "pallas-fused"."""
    got = {(r["model"], r["kernels"], r["B"], r["T"]): r for r in rows}
    out = {}
    for name in ("1.5b", "2.9b"):
        p = max((got[k] for k in ((name, "pallas", 1, 1), (name, "pallas-fused", 1, 1)) if k in got),
                key=lambda r: r["tok_s"], default=None)
        x = got.get((name, "xla", 1, 1))
        out[f"{name} best pallas/xla at B=1 >= {GOALS['pallas_over_xla_b1']}"] = (
            None if not (p and x) else p["tok_s"] / x["tok_s"])
        out[f"{name} best pallas B=1 HBM roofline fraction >= {GOALS['b1_hbm_roofline_fraction']}"] = (
            None if not p else p["hbm_roofline_fraction"])
    best = [r["tok_s"] for k, r in got.items() if k[0] == "2.9b" and k[2] == 256 and k[3] == 1]
    out[f"2.9b B=256 tok/s >= {GOALS['2.9b_b256_tok_s']}"] = max(best) if best else None
    return out


def per_launch_us(rows: list) -> dict:
    """{B: (step_pallas - step_fused) / (launches_pallas - launches_fused)} in us (issue 15)."""
    got = {(r["kernels"].removesuffix("-interpret"), r["B"]): r for r in rows if r["T"] == 1}
    out = {}
    for (kernels, B), fused in got.items():
        pallas = got.get(("pallas", B))
        if kernels == "pallas-fused" and pallas and pallas["launches"] > fused["launches"]:
            out[B] = (pallas["step_ms"] - fused["step_ms"]) * 1e3 / (pallas["launches"] - fused["launches"])
    return out


@functools.lru_cache(maxsize=None)


def paper_estimates() -> dict:
    """{(shape, kernels, B, T): estimate} of the compiled rows of ESTIMATES ({} without it)."""
    if not ESTIMATES.exists():
        return {}
    return {(r["shape"], r["kernels_option"], r["B"], r["T"]): r["estimate"]
            for r in json.loads(ESTIMATES.read_text())["rows"] if r.get("ok")}


def estimate_check(rows: list) -> list:
    """Measured decode rows beside the deviceless paper estimate for the same bucket."""
    out = []
    for r in rows:
        est = paper_estimates().get((r["model"], r["kernels"], r["B"], r["T"]))
        if est:
            ratio = r["step_ms"] * 1e3 / est["step_us"]
            out.append({"model": r["model"], "kernels": r["kernels"], "B": r["B"], "T": r["T"],
                        "measured_us": r["step_ms"] * 1e3, "estimated_us": est["step_us"],
                        "measured_over_estimate": ratio, "held_within_2x": 0.5 <= ratio <= 2.0})
    return out


def summary(sections: dict) -> dict:
    """Goals, per-launch cost and paper-estimate check from the rows measured so far."""
    rows = measured_rows(sections)
    return {"goals": goals(rows), "per_launch_us": per_launch_us(rows), "estimate_check": estimate_check(rows)}
