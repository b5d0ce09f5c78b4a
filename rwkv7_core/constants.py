"""The model's numeric constants (docs/MODEL.md), defined once for every implementation."""

LN_EPS = 1e-5
"""LayerNorm epsilon (ln0, ln1, ln2, ln_out)."""

GROUP_NORM_EPS = 64e-5
"""ln_x GroupNorm epsilon (H groups of N channels)."""

KK_EPS = 1e-12
"""Floor of the per-head L2 norm of kk."""

DECAY_SCALE = 0.606531
"""exp(-0.5): decay = exp(-DECAY_SCALE * sigmoid(w0 + lora)), in [0.545, 1)."""

WORLD_VOCAB_SIZE = 65536
"""Vocabulary of the RWKV World tokenizer."""

END_OF_TEXT = 0
"""Token id of end-of-text (the default stop token)."""
