"""The paper cost model of one forward (bytes moved, flops)."""
from rwkv7_core import named_config
from rwkv7_core.cost import step_bytes_and_flops


def test_roofline_accounting_counts_weights_state_and_flops():
    c = named_config("tiny")
    params_bytes = 4 * c.n_params
    nbytes, flops = step_bytes_and_flops(c, params_bytes, 4, B=2, T=1)
    emb = c.vocab_size * c.n_embd
    state = c.n_layer * (2 * c.n_embd * 4 + c.n_head * c.head_size ** 2 * 4)
    assert nbytes == params_bytes - 4 * emb + 2 * c.n_embd * 4 + 2 * 2 * state
    assert flops == 2 * 2 * (c.n_params - emb) + 6 * 2 * c.n_layer * c.n_head * c.head_size ** 2
