"""Shared fixtures: seeded random checkpoints written once per test session.

`tiny` is the named tiny shape; `odd` has C=192 (not a multiple of 128), three heads
and low-rank widths unlike any released model.
"""
from __future__ import annotations

import os

# Tests run on CPUs: every Triton kernel they run is interpreted, and Triton decides that when
# it is first imported (some test-extra packages, e.g. transformers, import it early).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from rwkv7_core import ModelConfig, named_config, write_random_checkpoint
from tests.shapes import ODD_CONFIG


def _write_pair(tmp_path_factory, name: str, config: ModelConfig, seed: int):
    d = tmp_path_factory.mktemp(name)
    for ext in ("pth", "safetensors"):
        write_random_checkpoint(d / f"model.{ext}", config, seed=seed)
    return d / "model.pth"


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """Path to a float32 tiny checkpoint (.pth; a .safetensors twin lies beside it)."""
    return _write_pair(tmp_path_factory, "tiny", named_config("tiny"), seed=1234)


@pytest.fixture(scope="session")
def odd_ckpt(tmp_path_factory):
    """Path to a float32 checkpoint of ODD_CONFIG (.pth; .safetensors twin beside it)."""
    return _write_pair(tmp_path_factory, "odd", ODD_CONFIG, seed=4321)
