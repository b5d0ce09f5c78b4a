"""Checkpoint I/O: round trips, .pth == .safetensors, the safetensors package agrees
with our reader/writer, config inference, and every error path names what is wrong."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rwkv7_apps.tools.random_checkpoint import main as random_cli
from rwkv7_core import CheckpointError, named_config, random_tensors, read_checkpoint, write_checkpoint
from tests.shapes import ODD_CONFIG


def _assert_same(a: dict, b: dict) -> None:
    assert list(a) == list(b) or sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        np.testing.assert_array_equal(np.asarray(a[k], np.float32), np.asarray(b[k], np.float32), err_msg=k)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("ext", ["pth", "safetensors"])
def test_round_trip(tmp_path, dtype, ext):
    config = named_config("tiny")
    tensors = random_tensors(config, seed=7, dtype=dtype)
    path = tmp_path / f"m.{ext}"
    write_checkpoint(path, tensors)
    loaded, inferred = read_checkpoint(path)
    assert inferred == config
    _assert_same(tensors, loaded)


def test_pth_reads_are_fresh_copies_that_survive_page_release(tmp_path):
    """A .pth is memory-mapped and each read hands its pages back to the kernel: every read
    is a writable copy of the file's values, and reading again (from re-faulted pages) gives
    them unchanged even after the first copy was overwritten."""
    tensors = random_tensors(named_config("tiny"), seed=int(np.random.default_rng().integers(1 << 30)),
                             dtype="bfloat16")
    write_checkpoint(tmp_path / "m.pth", tensors)
    loaded, _ = read_checkpoint(tmp_path / "m.pth")
    for key in ("emb.weight", "head.weight", "blocks.0.ffn.key.weight"):
        first = loaded[key]
        first[...] = 0
        again = loaded[key]
        assert again.flags.writeable and not np.shares_memory(first, again)
        np.testing.assert_array_equal(again.astype(np.float32), tensors[key].astype(np.float32), err_msg=key)


def test_random_init_is_seeded():
    c = named_config("tiny")
    a, b, other = random_tensors(c, seed=3), random_tensors(c, seed=3), random_tensors(c, seed=4)
    _assert_same(a, b)
    assert not np.array_equal(a["head.weight"], other["head.weight"])


def test_infers_odd_config(odd_ckpt):
    _, config = read_checkpoint(odd_ckpt)
    assert config == ODD_CONFIG


@pytest.mark.parametrize("fixture", ["tiny_ckpt", "odd_ckpt"])
def test_safetensors_equals_pth(request, fixture):
    pth = request.getfixturevalue(fixture)
    a, ca = read_checkpoint(pth)
    b, cb = read_checkpoint(pth.with_suffix(".safetensors"))
    assert ca == cb
    _assert_same(a, b)


def test_safetensors_package_agrees(tmp_path):
    from safetensors.numpy import load_file, save_file
    from safetensors.torch import save_file as torch_save_file

    tensors = random_tensors(named_config("tiny"), seed=11)
    ours = tmp_path / "ours.safetensors"
    write_checkpoint(ours, tensors)
    _assert_same(tensors, load_file(str(ours)))  # our writer -> their reader

    theirs = tmp_path / "theirs.safetensors"
    save_file(tensors, str(theirs))
    _assert_same(tensors, read_checkpoint(theirs)[0])  # their writer -> our reader

    bf16 = random_tensors(named_config("tiny"), seed=11, dtype="bfloat16")
    theirs_bf16 = tmp_path / "theirs_bf16.safetensors"
    torch_save_file({k: torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16)
                     for k, v in bf16.items()}, str(theirs_bf16))
    _assert_same(bf16, read_checkpoint(theirs_bf16)[0])


def test_random_cli_writes_seeded_checkpoint(tmp_path, capsys):
    out = tmp_path / "cli.safetensors"
    random_cli(["--shape", "tiny", "--out", str(out), "--seed", "5", "--dtype", "bfloat16"])
    assert "wrote" in capsys.readouterr().out
    _assert_same(random_tensors(named_config("tiny"), seed=5, dtype="bfloat16"),
                 read_checkpoint(out)[0])


# ----------------------------------------------------------------------------- errors
def _write_modified(tmp_path, edit) -> str:
    tensors = dict(random_tensors(named_config("tiny"), seed=1))
    edit(tensors)
    path = tmp_path / "bad.safetensors"
    write_checkpoint(path, tensors)
    return path


def test_missing_key(tmp_path):
    path = _write_modified(tmp_path, lambda t: t.pop("blocks.1.att.k_a"))
    with pytest.raises(CheckpointError, match=r"missing key 'blocks\.1\.att\.k_a'.*\(1, 1, 128\)"):
        read_checkpoint(path)


def test_unexpected_key(tmp_path):
    def add(t):
        t["blocks.0.att.extra"] = np.zeros((3, 4), np.float32)
    with pytest.raises(CheckpointError, match=r"unexpected key 'blocks\.0\.att\.extra'.*\(3, 4\)"):
        read_checkpoint(_write_modified(tmp_path, add))


def test_wrong_shape_names_key_expected_and_actual(tmp_path):
    def bad(t):
        t["blocks.1.att.key.weight"] = np.zeros((128, 96), np.float32)
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(_write_modified(tmp_path, bad))
    msg = str(err.value)
    assert "'blocks.1.att.key.weight'" in msg and "(128, 128)" in msg and "(128, 96)" in msg


def test_inconsistent_head_shape(tmp_path):
    def bad(t):
        for layer in range(2):
            t[f"blocks.{layer}.att.r_k"] = np.zeros((3, 64), np.float32)
    with pytest.raises(CheckpointError, match="r_k"):
        read_checkpoint(_write_modified(tmp_path, bad))


@pytest.mark.parametrize("ext", ["pth", "safetensors"])
def test_truncated_file(tmp_path, tiny_ckpt, ext):
    data = tiny_ckpt.with_suffix(f".{ext}").read_bytes()
    path = tmp_path / f"cut.{ext}"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cut"):
        read_checkpoint(path)


@pytest.mark.parametrize("ext", ["pth", "safetensors"])
@pytest.mark.parametrize("content", [b"", b"hello, I am not a checkpoint\n" * 20,
                                     b"\x10\x00\x00\x00\x00\x00\x00\x00[1, 2, 3]       "])
def test_non_checkpoint_file(tmp_path, ext, content):
    path = tmp_path / f"junk.{ext}"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="junk"):
        read_checkpoint(path)


def test_pth_that_is_not_a_state_dict(tmp_path):
    path = tmp_path / "list.pth"
    torch.save([torch.zeros(3)], path)
    with pytest.raises(CheckpointError, match="state dict"):
        read_checkpoint(path)


def test_bad_paths(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "nope.pth")
    (tmp_path / "m.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="extension"):
        read_checkpoint(tmp_path / "m.bin")


class _RunsCode:
    """Pickles as a call of os.system: what a malicious .pth holds."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("where", ["value", "nested"])
def test_code_carrying_pth_is_refused_in_one_line(tmp_path, where):
    import torch
    marker = tmp_path / "ran"
    payload = _RunsCode(marker)
    state = {"emb.weight": torch.zeros(2, 2)}
    state["x"] = payload if where == "value" else {"inner": [payload]}
    path = tmp_path / "evil.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message and "evil.pth" in message
    assert "posix.system" in message or "nt.system" in message
    assert "weights_only" not in message
    assert not marker.exists()


def test_nested_header_and_nan_weights_fail_in_one_line(tmp_path):
    """The safetensors library bounds the header (as --model and as --state); a weight holding
    NaN is refused when the model reads it, naming the key."""
    import rwkv_torch_ref
    from rwkv7_core.state_files import StateFileError, load_state

    nested = tmp_path / "nested.safetensors"
    header = b'{"a":' * 10000 + b"1" + b"}" * 10000
    nested.write_bytes(len(header).to_bytes(8, "little") + header)
    for read, error in ((read_checkpoint, CheckpointError),
                        (lambda p: load_state(p, named_config("tiny")), StateFileError)):
        with pytest.raises(error, match="nested.safetensors' is not a readable safetensors file") as err:
            read(nested)
        assert "\n" not in str(err.value)
    path = _write_modified(tmp_path, lambda t: t.update({"blocks.1.att.w0": np.full((1, 1, 128), np.nan, np.float32)}))
    with pytest.raises(CheckpointError, match=r"key 'blocks\.1\.att\.w0': holds non-finite values"):
        rwkv_torch_ref.load(path)
