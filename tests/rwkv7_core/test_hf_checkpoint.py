"""Hugging Face model directories (fla's RWKV7ForCausalLM layout): the layout fla's converter
writes, logits equal to the .pth (JAX and torch), round trips, the older variants, and every
bad directory failing in one line."""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import torch

from rwkv7_apps.tools.convert import main as convert
from rwkv7_core import CheckpointError, read_checkpoint
from rwkv7_core.checkpoint import read_safetensors, write_safetensors
from rwkv7_core.hf_checkpoint import write_hf_dir
from tests.shapes import ODD_CONFIG

UNUSED = ("blocks.0.att.v0", "blocks.0.att.v1", "blocks.0.att.v2")  # fla has no layer-0 v LoRA


@pytest.fixture(scope="module")
def hf_dir(odd_ckpt, tmp_path_factory):
    """The odd .pth as an HF directory in four shards."""
    out = tmp_path_factory.mktemp("hf") / "odd-hf"
    tensors, config = read_checkpoint(odd_ckpt)
    write_hf_dir(out, tensors, config, "float32", max_shard_bytes=2_000_000)
    return out


def _weights(directory) -> dict:
    out = {}
    for shard in sorted(directory.glob("*.safetensors")):
        out.update(read_safetensors(shard)[0])
    return out


def test_layout_is_fla_converters(hf_dir):
    c = ODD_CONFIG
    w = _weights(hf_dir)
    assert len(list(hf_dir.glob("model-*-of-00004.safetensors"))) == 4
    index = json.loads((hf_dir / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index) == set(w)
    assert w["model.embeddings.weight"].shape == (c.vocab_size, c.n_embd)
    assert w["model.layers.1.attn.w_lora.lora.0.weight"].shape == (c.d_decay, c.n_embd)  # transposed
    assert w["model.layers.1.attn.v_lora.lora.2.weight"].shape == (c.n_embd, c.d_mv)
    assert w["model.layers.1.attn.a_lora.lora.2.bias"].shape == (c.n_embd,)
    assert w["model.layers.2.attn.x_g"].shape == (1, 1, c.n_embd)
    assert w["model.layers.2.attn.k_k"].shape == w["model.layers.2.ffn.x_k"].shape == (c.n_embd,)
    assert {"model.layers.0.pre_norm.bias", "model.layers.2.attn.g_norm.weight", "lm_head.weight",
            "model.norm.bias", "model.layers.1.attn.o_proj.weight"} <= set(w)
    assert not any(k.startswith("model.layers.0.attn.v_lora") for k in w)
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["model_type"] == "rwkv7" and config["architectures"] == ["RWKV7ForCausalLM"]
    assert (config["hidden_size"], config["num_heads"], config["a_low_rank_dim"]) == (192, 3, 40)


def test_round_trip_is_bit_identical(odd_ckpt, hf_dir, tmp_path):
    ours, config = read_checkpoint(odd_ckpt)
    back, back_config = read_checkpoint(hf_dir)
    assert back_config == config and list(back) == list(ours)
    for key in ours:
        want = np.zeros(ours.shape(key), np.float32) if key in UNUSED else ours[key]
        assert back[key].dtype == want.dtype and back[key].tobytes() == want.tobytes(), key
    assert convert([str(hf_dir), "--to", "hf", "--out", str(tmp_path / "again")]) == 0
    assert _weights(tmp_path / "again").keys() == _weights(hf_dir).keys()
    assert all(a.tobytes() == _weights(hf_dir)[k].tobytes() for k, a in _weights(tmp_path / "again").items())


def test_logits_equal_the_pth(odd_ckpt, hf_dir):
    import rwkv_jax
    import rwkv_torch_ref

    tokens = np.array([[5, 17, 299, 3, 42]], np.int32)
    for load, wrap in ((rwkv_jax.load, lambda t: t), (rwkv_torch_ref.load, torch.from_numpy)):
        a, b = load(odd_ckpt, dtype="float32"), load(hf_dir, dtype="float32")
        la, _ = a.forward(wrap(tokens), a.init_state(1), full_output=True)
        lb, _ = b.forward(wrap(tokens), b.init_state(1), full_output=True)
        assert np.abs(np.asarray(la) - np.asarray(lb)).max() <= 1e-4


def test_bf16_export_loads(odd_ckpt, tmp_path):
    out = tmp_path / "bf16"
    assert convert([str(odd_ckpt), "--to", "hf", "--out", str(out), "--dtype", "bfloat16"]) == 0
    tensors, config = read_checkpoint(out)
    assert config == ODD_CONFIG and tensors["head.weight"].dtype == ml_dtypes.bfloat16
    ours = read_checkpoint(odd_ckpt)[0]["head.weight"]
    np.testing.assert_array_equal(tensors["head.weight"], ours.astype(ml_dtypes.bfloat16))
    assert convert([str(out), "--to", "safetensors", "--out", str(tmp_path / "m.safetensors")]) == 0
    assert read_checkpoint(tmp_path / "m.safetensors")[0].dtype("emb.weight") == ml_dtypes.bfloat16


def test_older_variants_read_the_same(hf_dir, tmp_path):
    """Fused attn.x_x [6, C] (fla's migration) and LoRA under our names, not transposed (llama.cpp)."""
    w = _weights(hf_dir)
    for i in range(ODD_CONFIG.n_layer):
        p = f"model.layers.{i}.attn."
        w[p + "x_x"] = np.concatenate([w.pop(p + f"x_{n}")[0] for n in "rwkvag"])
        for kind in "wavg":
            if p + f"{kind}_lora.lora.0.weight" in w:
                w[p + f"{kind}1"] = w.pop(p + f"{kind}_lora.lora.0.weight").T.copy()
                w[p + f"{kind}2"] = w.pop(p + f"{kind}_lora.lora.2.weight").T.copy()
            if p + f"{kind}_lora.lora.2.bias" in w:
                w[p + f"{kind}0"] = w.pop(p + f"{kind}_lora.lora.2.bias")[None, None]
    old = tmp_path / "old"
    old.mkdir()
    write_safetensors(old / "model.safetensors", w)
    (old / "config.json").write_text((hf_dir / "config.json").read_text().replace('"rwkv7"', '"rwkv7_fla"'))
    a, b = read_checkpoint(hf_dir)[0], read_checkpoint(old)[0]
    assert all(np.array_equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- bad input
def _copy(hf_dir, tmp_path, edit_config=None):
    out = tmp_path / "bad"
    out.mkdir()
    for f in hf_dir.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    if edit_config:
        cfg = json.loads((out / "config.json").read_text())
        edit_config(cfg)
        (out / "config.json").write_text(json.dumps(cfg))
    return out


def _no_weights(d):
    for f in d.glob("*.safetensors*"):
        f.unlink()


def _wrong_dtype(d):
    shard = next(d.glob("model-00001-*.safetensors"))
    tensors, meta = read_safetensors(shard)
    write_safetensors(shard, {**tensors, "model.embeddings.weight": tensors["model.embeddings.weight"].astype(np.int32)})


@pytest.mark.parametrize("case, edit, needles", [
    ("no weights", _no_weights, ["holds no weights", "model.safetensors"]),
    ("missing shard", lambda d: next(d.glob("model-00003-*")).unlink(), ["names the shard", "model-00003-of-00004"]),
    ("shape", lambda d: None, ["hidden_size=128", "'model.embeddings.weight'", "(300, 192)"]),
    ("model_type", lambda d: None, ["model_type 'llama'", "rwkv7"]),
    ("dtype", _wrong_dtype, ["'model.embeddings.weight'", "int32"]),
])
def test_bad_directory_fails_in_one_line(hf_dir, tmp_path, capsys, case, edit, needles):
    edits = {"shape": lambda c: c.update(hidden_size=128, num_heads=2), "model_type": lambda c: c.update(model_type="llama")}
    bad = _copy(hf_dir, tmp_path, edits.get(case))
    edit(bad)
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(bad)
    msg = str(err.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg
    assert convert([str(bad), "--to", "pth", "--out", str(tmp_path / "x.pth")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# ----------------------------------------------------------------------------- hostile input
@pytest.mark.parametrize("key, value, needle", [
    ("num_hidden_layers", 1e300, "num_hidden_layers=1e+300 must be an integer in [1, 4096]"),
    ("num_hidden_layers", 10**12, "num_hidden_layers=1000000000000 must be an integer"),
    ("v_low_rank_dim", 10**12, "v_low_rank_dim=1000000000000 must be an integer"),
    ("v_low_rank_dim", 10**4, "v_low_rank_dim=10000 exceeds hidden_size=192"),
    ("v_low_rank_dim", 100, "v_low_rank_dim=100, but tensor 'model.layers.1.attn.v_lora.lora.0.weight'"),
    ("vocab_size", -3, "vocab_size=-3 must be an integer"),
    ("hidden_size", "192", "hidden_size='192' must be an integer"),
    ("hidden_size", True, "hidden_size=True must be an integer"),
    ("intermediate_size", 2.5, "intermediate_size=2.5 must be an integer"),
    ("hidden_ratio", float("inf"), "hidden_ratio=inf must be a number"),
])
def test_config_sizes_are_bounded_before_any_allocation(hf_dir, tmp_path, key, value, needle):
    """A hostile config.json size is one line naming the key, before anything is built from it
    (1e300 layers used to build a 10^300-element set; v_low_rank_dim 10^12 a 466 TiB array)."""
    import resource

    def edit(c):
        c[key] = value
        if key == "hidden_ratio":
            c.pop("intermediate_size")

    bad = _copy(hf_dir, tmp_path, edit)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(CheckpointError) as err:
        tensors, _ = read_checkpoint(bad)
        dict(tensors)  # every tensor read: nothing may be sized by the hostile field
    msg = str(err.value)
    assert "\n" not in msg and needle in msg, msg
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: no large allocation


def test_one_layer_config_cannot_size_the_unused_layer0_lora(hf_dir, tmp_path):
    """A one-layer directory has no tensor carrying v_low_rank_dim (layer 0's v LoRA is filled
    with zeros): its width is still bounded by hidden_size, and good widths read as before."""
    one = _copy(hf_dir, tmp_path, lambda c: c.update(num_hidden_layers=1, v_low_rank_dim=10**7))
    w = _weights(one)
    for f in one.glob("*.safetensors*"):
        f.unlink()
    write_safetensors(one / "model.safetensors", {k: v for k, v in w.items() if ".layers.1." not in k
                                                 and ".layers.2." not in k})
    with pytest.raises(CheckpointError, match="v_low_rank_dim=10000000 must be an integer in"):
        read_checkpoint(one)
    cfg = json.loads((one / "config.json").read_text())
    (one / "config.json").write_text(json.dumps({**cfg, "v_low_rank_dim": 20}))
    tensors, config = read_checkpoint(one)
    assert config.n_layer == 1 and not tensors["blocks.0.att.v1"].any()


def _index_pointing(directory, shard_name: str) -> None:
    index = directory / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    first = next(iter(data["weight_map"]))
    data["weight_map"][first] = shard_name
    index.write_text(json.dumps(data))


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink out", "fifo"])
def test_shards_are_confined_to_the_model_directory(hf_dir, tmp_path, how):
    """Index entries that are absolute, hold '..', or are symlinks leading outside are refused
    with the same message whether the outside file exists or not (no existence oracle)."""
    import os

    outside = tmp_path / "outside"
    outside.mkdir()
    real = next(hf_dir.glob("model-00001-*.safetensors"))
    (outside / "real.safetensors").write_bytes(real.read_bytes())
    messages = []
    for i, target in enumerate(("real.safetensors", "gone.safetensors")):
        (tmp_path / f"d{i}").mkdir()
        bad = _copy(hf_dir, tmp_path / f"d{i}")
        if how == "absolute":
            _index_pointing(bad, str(outside / target))
        elif how == "dotdot":
            _index_pointing(bad, f"../../outside/{target}")
        elif how == "symlink out":
            (bad / "link.safetensors").symlink_to(outside / target)
            _index_pointing(bad, "link.safetensors")
        else:
            os.mkfifo(bad / "pipe.safetensors")
            _index_pointing(bad, "pipe.safetensors")
        with pytest.raises(CheckpointError) as err:
            read_checkpoint(bad)
        messages.append(str(err.value).replace(f"d{i}", "<dir>").replace(target[:4], "<name>"))
    assert messages[0] == messages[1] and "is not a file inside" in messages[0], messages


def test_symlinks_inside_the_directory_and_the_hub_cache_layout_load(hf_dir, tmp_path):
    """A shard symlinked within the directory, and the hub cache's snapshots/<rev> -> blobs links,
    still load bit-identically."""
    repo = tmp_path / "models--x--y"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc"
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(hf_dir.iterdir())):
        (repo / "blobs" / f"h{i}").write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(f"../../blobs/h{i}")
    a, b = read_checkpoint(hf_dir)[0], read_checkpoint(snap)[0]
    assert all(np.array_equal(a[k], b[k]) for k in a)
