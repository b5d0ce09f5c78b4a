"""State files and tuned-state files (rwkv7_core.state_files): bit-exact round trips, and
clear one-line refusals of another model's, malformed, truncated and code-carrying files."""
from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

from rwkv7_core import named_config, write_checkpoint
from rwkv7_core.checkpoint import read_safetensors, write_safetensors
from rwkv7_core.state_files import (
    FORMAT,
    SequenceState,
    StateFileDtypeError,
    StateFileError,
    convert_state,
    from_host_row,
    load_state,
    save_state,
    to_host_row,
    zero_state,
)
from tests.shapes import ODD_CONFIG

TINY = named_config("tiny")
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def random_state(config, rng, dtype="float32", tokens=None) -> SequenceState:
    z = zero_state(config)
    shift = lambda: rng.standard_normal(z.att_shift.shape).astype(DTYPES[dtype])  # noqa: E731
    return SequenceState(shift(), rng.standard_normal(z.wkv.shape).astype(np.float32), shift(),
                         int(rng.integers(0, 10**6)) if tokens is None else tokens)


def random_time_state(config, rng) -> dict:
    shape = (config.n_head, config.head_size, config.head_size)
    return {f"blocks.{i}.att.time_state": rng.standard_normal(shape).astype(np.float32)
            for i in range(config.n_layer)}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("config", [TINY, ODD_CONFIG], ids=["tiny", "odd"])
def test_round_trip_is_bit_exact(tmp_path, config, dtype):
    state = random_state(config, np.random.default_rng(), dtype)
    path = tmp_path / "s.safetensors"
    save_state(path, state, config)
    back = load_state(path, config)
    assert back.tokens == state.tokens
    for a, b in zip(state[:3], back[:3]):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    assert read_safetensors(path)[1]["format"] == FORMAT
    assert os.listdir(tmp_path) == ["s.safetensors"]  # the temporary file is gone


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_host_row_round_trip(dtype):
    state = random_state(TINY, np.random.default_rng(), dtype)
    row = to_host_row(state)
    assert row[0].shape == (1,) + state.att_shift.shape and row[1].dtype == np.float32 and row[3] is None
    back = from_host_row(row, state.tokens, dtype)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(state[:3], back[:3]))


def test_another_models_state_is_refused_naming_both_shapes(tmp_path):
    path = tmp_path / "odd.safetensors"
    save_state(path, random_state(ODD_CONFIG, np.random.default_rng()), ODD_CONFIG)
    with pytest.raises(StateFileError) as info:
        load_state(path, TINY)
    msg = str(info.value)
    assert "\n" not in msg and "odd.safetensors" in msg
    assert "L3 C192 H3xN64" in msg and "L2 C128 H2xN64" in msg


def test_same_shape_other_vocabulary_is_refused(tmp_path):
    path = tmp_path / "s.safetensors"
    save_state(path, random_state(TINY, np.random.default_rng()), TINY)
    with pytest.raises(StateFileError, match="V512.*V65536"):
        load_state(path, TINY._replace(vocab_size=65536))


def test_save_refuses_a_state_of_the_wrong_shape(tmp_path):
    state = random_state(ODD_CONFIG, np.random.default_rng())
    with pytest.raises(StateFileError, match="att_shift has shape"):
        save_state(tmp_path / "s.safetensors", state, TINY)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_truncated_state_file_is_refused(tmp_path, cut):
    path = tmp_path / "s.safetensors"
    save_state(path, random_state(TINY, np.random.default_rng()), TINY)
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * cut)])
    with pytest.raises(StateFileError, match="truncated|exceeds|too short"):
        load_state(path, TINY)


def test_tampered_state_files_are_refused(tmp_path):
    rng = np.random.default_rng()
    state = random_state(TINY, rng)
    tensors = {"att_shift": state.att_shift, "wkv": state.wkv, "ffn_shift": state.ffn_shift}
    meta = {"format": FORMAT, "model_shape": '{"n_layer": 2}', "dtype": "float32", "tokens": "3"}
    path = tmp_path / "bad.safetensors"
    write_safetensors(path, tensors, meta)
    with pytest.raises(StateFileError, match="malformed state metadata"):
        load_state(path, TINY)
    save_state(path, state, TINY)
    _, meta = read_safetensors(path)
    nan = state.wkv.copy()
    nan[1, 0, 3, 4] = np.nan
    write_safetensors(path, {**tensors, "wkv": nan}, meta)
    with pytest.raises(StateFileError, match="wkv holds non-finite values"):
        load_state(path, TINY)
    write_safetensors(path, {**tensors, "wkv": state.wkv.astype(np.float16)}, meta)
    with pytest.raises(StateFileError, match="metadata says state_dtype float32 but its wkv is float16"):
        load_state(path, TINY)
    write_safetensors(path, {**tensors, "wkv": state.wkv.astype(np.float64)}, {**meta, "state_dtype": "float64"})
    with pytest.raises(StateFileError, match=r"wkv has dtype float64, expected one of \('float32'"):
        load_state(path, TINY)
    write_safetensors(path, {"att_shift": state.att_shift, "wkv": state.wkv}, meta)
    with pytest.raises(StateFileError, match="expected the keys"):
        load_state(path, TINY)


def test_a_checkpoint_is_neither_kind_of_state(tmp_path, tiny_ckpt):
    with pytest.raises(StateFileError, match="neither a state file .* nor a tuned-state file"):
        load_state(tiny_ckpt.with_suffix(".safetensors"), TINY)
    with pytest.raises(StateFileError, match="does not exist"):
        load_state(tmp_path / "missing.safetensors", TINY)


# ----------------------------------------------------------------------------- tuned states
@pytest.mark.parametrize("ext", ["pth", "safetensors"])
def test_tuned_state_loads_without_transpose(tmp_path, ext):
    tensors = random_time_state(TINY, np.random.default_rng())
    path = tmp_path / f"tuned.{ext}"
    write_checkpoint(path, tensors)
    state = load_state(path, TINY)
    for i in range(TINY.n_layer):
        np.testing.assert_array_equal(state.wkv[i], tensors[f"blocks.{i}.att.time_state"])
    assert not state.att_shift.any() and not state.ffn_shift.any() and state.tokens == 0


def test_bfloat16_tuned_state_widens_to_float32(tmp_path):
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in random_time_state(TINY, np.random.default_rng()).items()}
    write_checkpoint(tmp_path / "t.pth", tensors)
    state = load_state(tmp_path / "t.pth", TINY)
    assert state.wkv.dtype == np.float32
    np.testing.assert_array_equal(state.wkv[1], tensors["blocks.1.att.time_state"].astype(np.float32))


@pytest.mark.parametrize("edit, pattern", [
    (lambda t: t.pop("blocks.1.att.time_state"), r"tuned state for 1 layers \(missing key 'blocks\.1\.att\.time_state'\)"),
    (lambda t: t.update({"blocks.2.att.time_state": t["blocks.0.att.time_state"]}),
     r"unexpected key 'blocks\.2\.att\.time_state'.*this model has 2 layers"),
    (lambda t: t.update({"blocks.1.att.time_state": np.zeros((2, 64, 32), np.float32)}),
     r"key 'blocks\.1\.att\.time_state': expected shape \(2, 64, 64\).*got \(2, 64, 32\)"),
    (lambda t: t.update({"blocks.1.att.extra": np.zeros(3, np.float32)}), "neither a state file"),
])
def test_bad_tuned_state_is_refused(tmp_path, edit, pattern):
    tensors = random_time_state(TINY, np.random.default_rng())
    edit(tensors)
    path = tmp_path / "t.safetensors"
    write_checkpoint(path, tensors)
    with pytest.raises(StateFileError, match=pattern):
        load_state(path, TINY)


def test_tuned_state_of_another_shape_is_refused(tmp_path):
    write_checkpoint(tmp_path / "t.pth", random_time_state(ODD_CONFIG, np.random.default_rng()))
    with pytest.raises(StateFileError, match=r"tuned state for 3 layers.*this model has 2 layers"):
        load_state(tmp_path / "t.pth", TINY)
    three_heads = TINY._replace(n_head=3, n_embd=192)
    write_checkpoint(tmp_path / "t.pth", random_time_state(three_heads, np.random.default_rng()))
    with pytest.raises(StateFileError, match=r"expected shape \(2, 64, 64\).*got \(3, 64, 64\)"):
        load_state(tmp_path / "t.pth", TINY)


class _RunsCode:
    """Pickles as a call of os.system: what a malicious .pth holds."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_code_carrying_tuned_state_is_refused(tmp_path):
    import torch
    marker = tmp_path / "ran"
    state = {"blocks.0.att.time_state": torch.zeros(2, 64, 64), "blocks.1.att.time_state": _RunsCode(marker)}
    torch.save(state, tmp_path / "evil.pth")
    with pytest.raises(StateFileError) as info:
        load_state(tmp_path / "evil.pth", TINY)
    msg = str(info.value)
    assert "\n" not in msg and "evil.pth" in msg and "system" in msg
    assert not marker.exists()


def test_truncated_tuned_pth_is_refused(tmp_path):
    write_checkpoint(tmp_path / "t.pth", random_time_state(TINY, np.random.default_rng()))
    data = (tmp_path / "t.pth").read_bytes()
    (tmp_path / "t.pth").write_bytes(data[:len(data) // 2])
    with pytest.raises(StateFileError, match="not a readable torch checkpoint"):
        load_state(tmp_path / "t.pth", TINY)


@pytest.mark.parametrize("state_dtype", ["bfloat16", "float16"])
def test_a_16_bit_state_round_trips_in_its_dtype_and_loads_only_as_that(tmp_path, state_dtype):
    rng = np.random.default_rng()
    state = random_state(TINY, rng)
    state = state._replace(wkv=state.wkv.astype(DTYPES[state_dtype]))
    path = tmp_path / "s.safetensors"
    save_state(path, state, TINY)
    assert read_safetensors(path)[1]["state_dtype"] == state_dtype
    assert os.path.getsize(path) < 0.55 * (state.wkv.size * 4)
    back = load_state(path, TINY, state_dtype)
    assert back.wkv.dtype == DTYPES[state_dtype] and np.array_equal(back.wkv, state.wkv)
    with pytest.raises(StateFileDtypeError) as e:
        load_state(path, TINY)  # a float32-state model
    message = str(e.value)
    assert "\n" not in message and str(path) in message
    assert f"its wkv state is {state_dtype} but this model holds its state in float32" in message
    widened = convert_state(back, "float32")
    assert widened.wkv.dtype == np.float32 and np.array_equal(widened.wkv, state.wkv.astype(np.float32))
    save_state(tmp_path / "f32.safetensors", widened, TINY)
    with pytest.raises(StateFileDtypeError, match="its wkv state is float32 but this model holds its state in"):
        load_state(tmp_path / "f32.safetensors", TINY, state_dtype)


def test_a_tuned_state_converts_to_the_model_state_dtype(tmp_path):
    rng = np.random.default_rng()
    tuned = random_time_state(TINY, rng)
    write_checkpoint(tmp_path / "tuned.pth", tuned)
    state = load_state(tmp_path / "tuned.pth", TINY, "bfloat16")
    assert state.wkv.dtype == ml_dtypes.bfloat16
    want = np.stack([tuned[f"blocks.{i}.att.time_state"] for i in range(TINY.n_layer)]).astype(ml_dtypes.bfloat16)
    assert np.array_equal(state.wkv, want)
    host = to_host_row(state)
    assert host[1].dtype == ml_dtypes.bfloat16
    assert from_host_row(host, 3, "float32").wkv.dtype == ml_dtypes.bfloat16


def test_a_state_dtype_the_metadata_contradicts_is_refused(tmp_path):
    state = random_state(TINY, np.random.default_rng())
    path = tmp_path / "s.safetensors"
    save_state(path, state, TINY)
    tensors, meta = read_safetensors(path)
    write_safetensors(path, {k: np.array(v) for k, v in tensors.items()}, {**meta, "state_dtype": "bfloat16"})
    with pytest.raises(StateFileError, match="metadata says state_dtype bfloat16 but its wkv is float32"):
        load_state(path, TINY, "bfloat16")
