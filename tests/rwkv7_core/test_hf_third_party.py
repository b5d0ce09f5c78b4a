"""Hugging Face directories against a third-party converter and model on the package index
(``rwkv7-hf``, in the test extras): its ``convert`` output loads here with logits equal to the
.pth (JAX and torch, float32), its bf16 export loads, and the directory ours writes loads in
its ``RWKV7ForCausalLM`` with logits equal to ours. Offline: nothing reaches a hub."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

import rwkv_jax
import rwkv_torch_ref
from rwkv7_apps.tools.convert import main as convert
from rwkv7_core import named_config, random_tensors, read_checkpoint, write_checkpoint

rwkv7_hf = pytest.importorskip("rwkv7_hf")  # in the test extras; skipped only outside them
OFFLINE = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def _third_party_convert(pth: Path, out: Path, precision: str) -> None:
    script = Path(sys.executable).parent / "rwkv7-hf"
    proc = subprocess.run([str(script), "convert", "--input", str(pth), "--output", str(out),
                           "--precision", precision], env=OFFLINE, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def random_pth(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """A fresh random float32 tiny .pth and random tokens [1, 7]."""
    rng = np.random.default_rng()
    config = named_config("tiny")
    path = tmp_path_factory.mktemp("third-party") / "m.pth"
    write_checkpoint(path, random_tensors(config, seed=int(rng.integers(1 << 30)), dtype="float32"))
    return path, rng.integers(1, config.vocab_size, (1, 7)).astype(np.int32)


def _logits(model, tokens: np.ndarray, as_torch: bool) -> np.ndarray:
    logits, _ = model.forward(torch.from_numpy(tokens) if as_torch else tokens, model.init_state(1), full_output=True)
    return np.asarray(logits)[0]


def test_third_party_export_loads_with_equal_logits(random_pth, tmp_path):
    pth, tokens = random_pth
    _third_party_convert(pth, tmp_path / "hf", "float32")
    _third_party_convert(pth, tmp_path / "hf-bf16", "bf16")
    assert read_checkpoint(tmp_path / "hf")[1] == read_checkpoint(pth)[1]
    for load, as_torch in ((rwkv_jax.load, False), (rwkv_torch_ref.load, True)):
        want = _logits(load(pth, dtype="float32"), tokens, as_torch)
        got = _logits(load(tmp_path / "hf", dtype="float32"), tokens, as_torch)
        assert np.abs(got - want).max() <= 1e-4, load.__module__
    bf16, config = read_checkpoint(tmp_path / "hf-bf16")
    assert config == read_checkpoint(pth)[1] and bf16.dtype("head.weight") == ml_dtypes.bfloat16
    assert np.isfinite(_logits(rwkv_jax.load(tmp_path / "hf-bf16", dtype="bfloat16"), tokens, False)).all()


def test_our_export_loads_in_the_third_party_model(random_pth, tmp_path, monkeypatch):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    pth, tokens = random_pth
    assert convert([str(pth), "--to", "hf", "--out", str(tmp_path / "ours")]) == 0
    model = rwkv7_hf.RWKV7ForCausalLM.from_pretrained(str(tmp_path / "ours"), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = model(torch.from_numpy(tokens).long()).logits[0].numpy()
    ours = _logits(rwkv_torch_ref.load(pth, dtype="float32"), tokens, True)
    assert np.abs(theirs - ours).max() <= 1e-4
