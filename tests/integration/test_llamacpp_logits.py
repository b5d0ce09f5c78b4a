"""A third implementation: llama.cpp's f32 logits against the JAX model's on a fresh random model.

The checkpoint goes the way a user's would: our exporter (``rwkv7-convert --to hf``), then
llama.cpp's own converter to GGUF f32, then ``llama-debug`` runs a random text as llama.cpp
tokenizes it (World vocabulary) and saves the last position's logits; the JAX model runs the
same token ids. Needs a llama.cpp build made by ``benchmarks/vs_llamacpp.py --build-only``
(found through ``$RWKV7_LLAMACPP_DIR``, default ``~/.cache/rwkv7-llamacpp``); skipped with the
reason when there is none (building takes ~11 minutes of 2 cores, so CI does not).
"""
import string

import numpy as np
import pytest

from benchmarks.vs_llamacpp import LlamaCpp
from rwkv7_apps.tools.convert import main as convert_main
from rwkv7_core.config import ModelConfig
from rwkv7_core.random_weights import write_random_checkpoint

# Small, but with the World vocabulary: the exporter writes its vocabulary file, which
# llama.cpp's converter needs for an RWKV-7 model.
CONFIG = ModelConfig(n_layer=2, n_embd=128, n_head=2, head_size=64, vocab_size=65536, dim_ffn=512,
                     d_decay=32, d_aaa=32, d_mv=16, d_gate=32)
LIMIT = 1e-4  # the float32 parity limit of the other cross-framework tests


@pytest.fixture(scope="module")
def llamacpp() -> LlamaCpp:
    lc = LlamaCpp.at()
    if not lc.built():
        pytest.skip(f"no llama.cpp build under {lc.root} (make one: python benchmarks/vs_llamacpp.py --build-only)")
    return lc


def test_last_logits_match_llamacpp_f32(llamacpp, tmp_path):
    import rwkv_jax

    seed = int(np.random.SeedSequence().entropy % (1 << 31))
    rng = np.random.default_rng(seed)
    pth, hf = tmp_path / "m.pth", tmp_path / "m-hf"
    write_random_checkpoint(pth, CONFIG, seed=seed)
    assert convert_main([str(pth), "--to", "hf", "--out", str(hf)]) == 0
    gguf = llamacpp.to_gguf(hf, "f32", tmp_path / "m-f32.gguf")
    words = ["".join(rng.choice(list(string.ascii_lowercase), rng.integers(2, 9))) for _ in range(12)]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tokens, theirs = llamacpp.last_logits(gguf, " ".join(words), run_dir)
    assert tokens.size >= 12 and theirs.shape == (CONFIG.vocab_size,)

    model = rwkv_jax.load(pth, dtype="float32")
    ours, _ = model.forward(tokens[None].astype(np.int32), model.init_state(1))
    ours = np.asarray(ours)[0]
    diff = float(np.abs(ours - theirs).max())
    assert diff < LIMIT, f"seed {seed}: max |logit difference| {diff:.2e} on {tokens.size} tokens"
