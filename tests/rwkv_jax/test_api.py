"""rwkv_jax's public API on the tiny checkpoint: batch independence, path coverage, the
forward compiled ahead of time in the engine's executable cache, input errors, and loading
.safetensors with torch blocked."""
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rwkv_jax
from rwkv_jax import Path
from rwkv_jax.paths import MAX_DECODE_BATCH


@pytest.fixture(scope="module")
def tiny(tiny_ckpt):
    return rwkv_jax.load(tiny_ckpt)


def test_batch_rows_equal_single_runs_and_paths_are_reported(tiny):
    """A B=3 batch (prefill then two decode steps) equals three B=1 runs row by row, and
    each call reports the path select_path chose (DENSE, BATCHED_DECODE, B1T1)."""
    V = tiny.config.vocab_size
    rng = np.random.default_rng(21)
    prompts, steps = rng.integers(0, V, size=(3, 8)), rng.integers(0, V, size=(2, 3))
    before = tiny.path_counts.copy()
    batch_logits, state = tiny.forward(prompts, tiny.init_state(3), full_output=True)
    assert tiny.last_path is Path.DENSE
    batch_steps = []
    for tok in steps:
        logits, state = tiny.forward(tok[:, None], state)
        assert tiny.last_path is Path.BATCHED_DECODE
        batch_steps.append(np.asarray(logits))

    for row in range(3):
        logits, s = tiny.forward(prompts[row:row + 1], tiny.init_state(1), full_output=True)
        np.testing.assert_allclose(np.asarray(batch_logits[row]), np.asarray(logits[0]), atol=1e-5, rtol=0)
        for i, tok in enumerate(steps[:, row]):
            logits, s = tiny.forward(np.array([[tok]]), s)
            assert tiny.last_path is Path.B1T1
            np.testing.assert_allclose(batch_steps[i][row], np.asarray(logits[0]), atol=1e-5, rtol=0)
        for leaf, single in zip(state, s):
            np.testing.assert_allclose(np.asarray(leaf[row]), np.asarray(single[0]), atol=1e-5, rtol=0)

    taken = tiny.path_counts - before
    assert taken == {Path.DENSE: 4, Path.BATCHED_DECODE: 2, Path.B1T1: 6}


def test_the_engine_compiles_the_forward_once_and_it_equals_model_forward(tiny):
    """The engine's one executable cache holds the model forward too: compiled ahead of time
    once per (B, T, full_output), the same executable afterwards, with Model.forward's outputs."""
    from rwkv_jax.engine import JaxEngine

    engine, key = JaxEngine(tiny), ("forward", (3, 1, False))
    exe = engine.executables.get(key)
    assert engine.compile_seconds[key] > 0 and engine.executables.get(key) is exe
    rng = np.random.default_rng()
    prompts = rng.integers(0, tiny.config.vocab_size, (3, 5))
    tokens = rng.integers(0, tiny.config.vocab_size, (3, 1)).astype(np.int32)
    _, start = tiny.forward(prompts, tiny.init_state(3))
    starts = [jax.tree.map(jnp.copy, start) for _ in range(2)]
    want_logits, want_state = tiny.forward(tokens, starts[0])
    logits, state = exe(tiny.params, tokens, starts[1])
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want_logits), atol=1e-6, rtol=0)
    for got, want in zip(state, want_state):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=0)


def test_decode_beyond_max_batch_runs_dense_form_with_same_result(tiny):
    """T=1 with B > MAX_DECODE_BATCH takes DENSE (sequence form with T=1); its rows equal
    the batched-decode step form's."""
    B = MAX_DECODE_BATCH + 1
    tokens = np.random.default_rng(22).integers(0, tiny.config.vocab_size, size=(B, 1))
    dense, dense_state = tiny.forward(tokens, tiny.init_state(B))
    assert tiny.last_path is Path.DENSE
    step, step_state = tiny.forward(tokens[:3], tiny.init_state(3))
    assert tiny.last_path is Path.BATCHED_DECODE
    np.testing.assert_allclose(np.asarray(dense[:3]), np.asarray(step), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(dense_state.wkv[:3]), np.asarray(step_state.wkv), atol=1e-5, rtol=0)


def test_bad_inputs_raise_value_errors_naming_the_problem(tiny):
    V, state = tiny.config.vocab_size, tiny.init_state(1)
    cases = [
        (np.array([[V]]), state, "token ids must lie in"),
        (np.array([[-1]]), state, "token ids must lie in"),
        (np.zeros((1, 0), np.int32), state, "empty"),
        (np.array([1, 2]), state, r"shape \[B, T\]"),
        (np.array([[1.5]]), state, "integer"),
        (np.array([[1], [2]]), state, "batch size differs"),
        (np.array([[1]]), rwkv_jax.State(*(jnp.swapaxes(x, 0, 1) for x in tiny.init_state(1))), "leading batch axis"),
        (np.array([[1]]), state._replace(wkv=state.wkv.astype(jnp.float16)), "state.wkv has dtype"),
        (np.array([[1]]), [state.att_shift[0, 0]] * 6, "must be a State"),
    ]
    for tokens, st, message in cases:
        with pytest.raises(ValueError, match=message):
            tiny.forward(tokens, st)
    with pytest.raises(ValueError, match="dtype 'int8' not supported"):
        rwkv_jax.load("unused.pth", dtype="int8")
    with pytest.raises(ValueError, match="unknown kernels"):
        rwkv_jax.load("unused.pth", kernels="cuda")


NO_TORCH_SCRIPT = textwrap.dedent("""
    import importlib.abc, sys
    class BlockTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("import of torch is blocked in this test")
            return None
    sys.meta_path.insert(0, BlockTorch())
    import numpy as np
    import rwkv_jax
    checkpoint, cache_dir, out = sys.argv[1:]
    rwkv_jax.enable_compilation_cache(cache_dir)
    m = rwkv_jax.load(checkpoint)
    logits, _ = m.forward(np.array([[5]]), m.init_state(1))
    assert "torch" not in sys.modules, "torch was imported"
    np.save(out, np.asarray(logits))
""")


def test_safetensors_loads_and_runs_with_torch_blocked(tiny, tiny_ckpt, tmp_path):
    """In a subprocess where `import torch` fails: import rwkv_jax, load the .safetensors
    twin, run a step (with the persistent compilation cache on) -> same logits as the .pth."""
    cache = tmp_path / "jax_cache"
    out = tmp_path / "logits.npy"
    proc = subprocess.run([sys.executable, "-c", NO_TORCH_SCRIPT, str(tiny_ckpt.with_suffix(".safetensors")),
                           str(cache), str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected, _ = tiny.forward(np.array([[5]]), tiny.init_state(1))
    np.testing.assert_allclose(np.load(out), np.asarray(expected), atol=1e-6, rtol=0)
    assert any(p.is_file() for p in cache.rglob("*")), "persistent compilation cache stayed empty"
