"""Hugging Face RWKV-7 model directories (``RWKV7ForCausalLM``, fla's layout), read and written.

A directory holds ``config.json`` (``model_type`` ``rwkv7``, or ``rwkv7_fla`` of older fla
releases; fla's ``RWKV7Config`` keys), the weights as ``model.safetensors`` or as the shards
that ``model.safetensors.index.json`` names, and optionally the World tokenizer's vocabulary
(``VOCAB_FILE``). Tensor names and layouts: ``hf_names``. Reading gives our official layout as
``LazyTensors`` (each tensor read from its shard on access); the model's shape comes from
config.json and is cross-checked against every tensor shape.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from functools import partial
from pathlib import Path
from typing import Mapping

import numpy as np

from .config import ModelConfig, expected_shapes
from .hf_names import Source, fla_source, unused_in_fla, variant_sources
from .tensor_files import (
    FLOATS,
    SUPPORTED_DTYPES,
    CheckpointError,
    Entry,
    LazyTensors,
    safetensors_entries,
    write_safetensors,
)

MODEL_TYPES = ("rwkv7", "rwkv7_fla")
VOCAB_FILE = "rwkv_vocab_v20230424.txt"
INDEX = "model.safetensors.index.json"


# ----------------------------------------------------------------------------- config.json
def read_hf_config(directory: str | os.PathLike) -> ModelConfig:
    """Our ModelConfig of ``directory/config.json`` (fla's ``RWKV7Config`` keys); fla's defaults for
    absent low-rank widths. CheckpointError for a missing or unknown ``model_type`` or
    settings our model does not implement."""
    path = Path(directory) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{str(path)!r}: cannot read the model config ({e})") from None
    if not isinstance(raw, dict) or raw.get("model_type") not in MODEL_TYPES:
        got = raw.get("model_type") if isinstance(raw, dict) else None
        raise CheckpointError(f"{str(path)!r}: model_type {got!r} is not an RWKV-7 model (expected one of "
                              f"{', '.join(MODEL_TYPES)})")
    for key, want in (("hidden_act", "sqrelu"), ("norm_first", True), ("norm_bias", True), ("norm_eps", 1e-5),
                      ("tie_word_embeddings", False)):
        if raw.get(key, want) != want:
            raise CheckpointError(f"{str(path)!r}: {key}={raw[key]!r} is not supported (only {want!r})")
    try:
        C, L, V = int(raw["hidden_size"]), int(raw["num_hidden_layers"]), int(raw["vocab_size"])
        N = int(raw.get("head_dim") or (C // int(raw["num_heads"]) if raw.get("num_heads") else 64))
        F = raw.get("intermediate_size") or 32 * -(-int(C * (raw.get("hidden_ratio") or 4)) // 32)
        config = ModelConfig(n_layer=L, n_embd=C, n_head=int(raw.get("num_heads") or C // N), head_size=N,
                             vocab_size=V, dim_ffn=int(F), d_decay=int(raw.get("decay_low_rank_dim", 64)),
                             d_aaa=int(raw.get("a_low_rank_dim", 64)), d_mv=int(raw.get("v_low_rank_dim", 16)),
                             d_gate=int(raw.get("gate_low_rank_dim", 128)))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise CheckpointError(f"{str(path)!r}: malformed RWKV-7 config ({type(e).__name__}: {e})") from None
    return config


def hf_config(config: ModelConfig, dtype: str) -> dict:
    """config.json of ``config`` as fla's ``RWKV7Config`` (and rwkv7-hf) write it."""
    c = config
    return {"architectures": ["RWKV7ForCausalLM"], "model_type": "rwkv7", "attn_mode": "chunk",
            "hidden_size": c.n_embd, "num_hidden_layers": c.n_layer, "head_dim": c.head_size,
            "num_heads": c.n_head, "intermediate_size": c.dim_ffn, "hidden_ratio": c.dim_ffn / c.n_embd,
            "decay_low_rank_dim": c.d_decay, "a_low_rank_dim": c.d_aaa, "v_low_rank_dim": c.d_mv,
            "gate_low_rank_dim": c.d_gate, "value_dim": [c.n_embd] * c.n_layer, "vocab_size": c.vocab_size,
            "hidden_act": "sqrelu", "norm_first": True, "norm_bias": True, "norm_eps": 1e-5,
            "fuse_norm": False, "tie_word_embeddings": False, "use_cache": True,
            "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "torch_dtype": dtype}


# ----------------------------------------------------------------------------- reading
def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a model directory (the index's shards, or model.safetensors);
    CheckpointError naming what is missing."""
    index = directory / INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{str(index)!r}: malformed index ({type(e).__name__}: {e})") from None
        for shard in shards:
            if not (directory / shard).is_file():
                raise CheckpointError(f"{str(index)!r} names the shard {shard!r}, which is not in {str(directory)!r}")
        return [directory / s for s in shards]
    if (directory / "model.safetensors").is_file():
        return [directory / "model.safetensors"]
    others = sorted(p.name for p in directory.iterdir() if p.suffix in (".bin", ".pth", ".pt", ".gguf"))
    raise CheckpointError(f"{str(directory)!r} holds no weights: neither model.safetensors nor {INDEX}"
                          + (f" (found {', '.join(others)}: only safetensors are read)" if others else ""))


def read_hf_dir(directory: str | os.PathLike) -> LazyTensors:
    """Our official layout of an HF model directory, each tensor read on access. Every
    config.json size is checked against the tensors (CheckpointError naming the key and both
    shapes); a tensor the mapping does not use is an error too."""
    directory = Path(directory)
    config = read_hf_config(directory)
    found: dict[str, Entry] = {}
    for shard in weight_files(directory):
        found.update(safetensors_entries(shard)[0])
    _check_layers(directory, config, found)
    entries, used = {}, set()
    for key, shape in expected_shapes(config).items():
        source = _pick(key, found)
        if source is None:
            if unused_in_fla(key):
                dtype = found["model.embeddings.weight"].dtype
                entries[key] = Entry(shape, dtype, partial(np.zeros, shape, dtype))
                continue
            raise CheckpointError(f"{str(directory)!r}: missing tensor {fla_source(key).name!r} (our {key!r})")
        used.add(source.name)
        src = found[source.name]
        if src.dtype not in FLOATS:
            raise CheckpointError(f"{str(directory)!r}: tensor {source.name!r} has dtype {src.dtype} (expected one "
                                  f"of {', '.join(SUPPORTED_DTYPES)})")
        if src.shape not in _source_shapes(source, shape):
            raise CheckpointError(f"{str(directory)!r}: tensor {source.name!r} has shape {src.shape}, but "
                                  f"config.json gives {_source_shapes(source, shape)[0]} ({_describe(config)})")
        entries[key] = Entry(shape, src.dtype, _reader(src, source, shape))
    extra = sorted(set(found) - used)
    if extra:
        raise CheckpointError(f"{str(directory)!r}: unexpected tensor {extra[0]!r} with shape {found[extra[0]].shape}"
                              + (f" and {len(extra) - 1} more" if len(extra) > 1 else ""))
    return LazyTensors(entries, str(directory))


def _check_layers(directory: Path, config: ModelConfig, found: Mapping[str, Entry]) -> None:
    """config.json's sizes against the tensors that carry them, naming key and shapes."""
    layers = {int(m.group(1)) for k in found if (m := re.match(r"model\.layers\.(\d+)\.", k))}
    if layers != set(range(config.n_layer)):
        raise CheckpointError(f"{str(directory)!r}: config.json num_hidden_layers={config.n_layer}, but the "
                              f"tensors hold layers {min(layers, default=None)}..{max(layers, default=None)}")
    probes = (("vocab_size", "model.embeddings.weight", 0, config.vocab_size),
              ("hidden_size", "model.embeddings.weight", 1, config.n_embd),
              ("intermediate_size", "model.layers.0.ffn.key.weight", 0, config.dim_ffn),
              ("num_heads", "model.layers.0.attn.r_k", 0, config.n_head),
              ("head_dim", "model.layers.0.attn.r_k", 1, config.head_size))
    for key, name, axis, value in probes:
        shape = found[name].shape if name in found else None
        if shape is not None and (len(shape) <= axis or shape[axis] != value):
            raise CheckpointError(f"{str(directory)!r}: config.json {key}={value}, but tensor {name!r} has shape "
                                  f"{shape} (axis {axis} is {key})")


def _describe(c: ModelConfig) -> str:
    return (f"hidden_size={c.n_embd}, num_heads={c.n_head}, head_dim={c.head_size}, vocab_size={c.vocab_size}, "
            f"intermediate_size={c.dim_ffn}, decay/a/v/gate_low_rank_dim={c.d_decay}/{c.d_aaa}/{c.d_mv}/{c.d_gate}")


def _pick(key: str, found: Mapping[str, Entry]) -> Source | None:
    return next((s for s in [fla_source(key)] + variant_sources(key) if s.name in found), None)


def _source_shapes(source: Source, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The shapes the source tensor may have for our ``shape`` (the first is fla's)."""
    if source.how == "transpose":
        return [shape[::-1]]
    if source.how == "reshape":
        return [(shape[-1],), shape]
    if source.how == "row":
        return [(6, shape[-1])]
    return [shape]


def _reader(src: Entry, source: Source, shape: tuple[int, ...]):
    def read() -> np.ndarray:
        a = src.read()
        if source.how == "transpose":
            return np.ascontiguousarray(a.T)
        if source.how == "row":
            return a[source.row].reshape(shape).copy()
        return a.reshape(shape)
    return read


# ----------------------------------------------------------------------------- writing
def write_hf_dir(directory: str | os.PathLike, tensors: Mapping[str, np.ndarray], config: ModelConfig,
                 dtype: str, max_shard_bytes: int | None = None, vocab_file: str | os.PathLike | None = None) -> list[Path]:
    """Write our-layout ``tensors`` (any float dtype, cast to ``dtype``) as an HF model
    directory fla's and rwkv7-hf's loaders read: config.json, model.safetensors (or shards of
    at most ``max_shard_bytes`` and their index; tensors are read and written one shard at a
    time), and ``vocab_file`` copied as ``VOCAB_FILE``. Returns the weight files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = np.dtype(SUPPORTED_DTYPES[dtype])
    plan: list[list[tuple[str, str]]] = [[]]
    size = total = 0
    for key, shape in expected_shapes(config).items():
        if unused_in_fla(key):
            continue
        nbytes = int(np.prod(_source_shapes(fla_source(key), shape)[0])) * target.itemsize
        if max_shard_bytes and plan[-1] and size + nbytes > max_shard_bytes:
            plan.append([])
            size = 0
        plan[-1].append((key, fla_source(key).name))
        size += nbytes
        total += nbytes
    names = (["model.safetensors"] if len(plan) == 1 else
             [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))])
    for name, shard in zip(names, plan):
        write_safetensors(directory / name, {hf: _to_fla(key, tensors[key]).astype(target, copy=False)
                                             for key, hf in shard}, {"format": "pt"})
    if len(plan) > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {hf: name for name, shard in zip(names, plan) for _, hf in shard}}
        (directory / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    (directory / "config.json").write_text(json.dumps(hf_config(config, dtype), indent=2) + "\n")
    if vocab_file is not None:
        shutil.copyfile(vocab_file, directory / VOCAB_FILE)
    return [directory / n for n in names]


def _to_fla(key: str, a: np.ndarray) -> np.ndarray:
    source = fla_source(key)
    if source.how == "transpose":
        return np.ascontiguousarray(a.T)
    return a.reshape(_source_shapes(source, tuple(a.shape))[0])
