"""Model shapes the tests use beside the named ones (not a test module)."""
from rwkv7_core import ModelConfig

ODD_CONFIG = ModelConfig(n_layer=3, n_embd=192, n_head=3, head_size=64, vocab_size=300,
                         dim_ffn=768, d_decay=24, d_aaa=40, d_mv=20, d_gate=56)
"""C=192 (not a multiple of 128), three heads and low-rank widths unlike any released model."""
