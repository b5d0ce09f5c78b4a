"""Section torch_parity, run in a child process (``gpu_check.py --torch-parity``) beside the
JAX parity: torch and JAX never share a process. The torch reference with its Triton kernels
against the same torch model without them and against the JAX model (kernels="xla", CPU),
same random weights: logits of a prefill and 3 decode steps and the final state, float32,
within TOL x max(1, |reference|)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path as FsPath

import jax
import numpy as np

import rwkv_jax
from benchmarks.gpu_checks.common import ODD, TOL, attempt, diff, skipped, within
from rwkv7_core.config import named_config
from rwkv7_core.random_weights import write_random_checkpoint

SCRIPT = FsPath(__file__).resolve().parents[1] / "gpu_check.py"  # its --torch-parity runs run_torch_parity


def start_torch_parity(smoke: bool) -> subprocess.Popen:
    """gpu_check.py --torch-parity in a child process (JAX on the CPU there)."""
    cmd = [sys.executable, str(SCRIPT), "--torch-parity"] + (["--smoke"] if smoke else [])
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})


def collect_torch_parity(child: subprocess.Popen, wait_s: float) -> dict:
    """The child's JSON answer, waiting at most wait_s more for it."""
    try:
        out, err = child.communicate(timeout=max(wait_s, 1.0))
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return {"error": f"no answer within {wait_s:.0f} s after the JAX parity"}
    if child.returncode != 0:
        return {"error": f"exit status {child.returncode}: {err.strip()[-1500:]}"}
    return json.loads(out.strip().splitlines()[-1])


def run_torch_parity(smoke: bool) -> dict:
    """The torch reference with its Triton kernels (compiled for CUDA; interpreted on a CPU in
    --smoke) against itself without them and against the JAX model, same random weights."""
    try:
        import torch  # only in this child process: torch stays out of the JAX run
    except ImportError as e:
        return skipped(f"torch is not installed ({e})")
    if torch.cuda.is_available():
        device, how = "cuda", f"compiled for {torch.cuda.get_device_name()}"
    elif smoke:
        device, how = "cpu", "interpreted (TRITON_INTERPRET=1, CPU)"
    else:
        return skipped(f"torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda})")
    has_triton = importlib.util.find_spec("triton") is not None
    if has_triton and device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels' @triton.jit runs
        from rwkv_torch_ref.triton_kernels import runtime_loops_broken  # imports torch, as above
        if runtime_loops_broken():
            has_triton, how = False, f"skipped: {runtime_loops_broken()}"
    kinds = ("triton", "torch") if has_triton else ("torch",)
    shapes = ((named_config("tiny"), 2, 9),) + (() if smoke else ((ODD, 1, 6),))
    cases = [attempt({"config": f"C={c.n_embd} H={c.n_head} L={c.n_layer}", "B": B, "T": T},
                     torch_case, c, B, T, device, kinds) for c, B, T in shapes]
    return {"device": device, "torch": torch.__version__,
            "triton": how if has_triton else how if how.startswith("skipped") else "not installed: torch path only",
            "jax": f"kernels=xla on {jax.default_backend()}", "tol": TOL, "cases": cases,
            "ok": all(c.get("ok", False) for c in cases)}


def torch_case(config, B, T, device, kinds) -> dict:
    """Prefill of T tokens then 3 decode steps through torch models of ``kinds`` and the JAX
    model from one random checkpoint; every pair compared on all logits and the last state."""
    import rwkv_torch_ref  # imports torch, as above
    with tempfile.TemporaryDirectory() as d:
        path = FsPath(d) / "model.safetensors"
        write_random_checkpoint(path, config, seed=0)
        models = {k: rwkv_torch_ref.load(path, dtype="float32", kernels=k, device=device) for k in kinds}
        models["jax"] = rwkv_jax.load(path, dtype="float32", kernels="xla")
    states = {k: m.init_state(B) for k, m in models.items()}
    logits = {k: [] for k in models}
    rng = np.random.default_rng(B * 100 + T)
    for t in (T, 1, 1, 1):
        tokens = rng.integers(0, config.vocab_size, (B, t))
        for k, m in models.items():
            out, states[k] = m.forward(tokens, states[k])
            logits[k].append(_host(out))
    rows = []
    for a, b in [(a, b) for i, a in enumerate(models) for b in list(models)[i + 1:]]:
        d = {"logits": diff(logits[a], logits[b]), "state": diff(map(_host, states[a]), map(_host, states[b]))}
        rows.append({"kernels": a, "reference": b, **d, "ok": all(within(x, TOL) for x in d.values())})
    return {"pairs": rows, "ok": all(r["ok"] for r in rows)}


def _host(x) -> np.ndarray:
    """A torch tensor (any device) or a JAX array as a host numpy array."""
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
