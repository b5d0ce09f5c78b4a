"""Tensor names of Hugging Face RWKV-7 directories (fla's ``RWKV7ForCausalLM``) against ours.

Read from the converters rather than guessed: fla-org/flash-linear-attention
``utils/convert_from_rwkv7.py`` (names, which tensors are transposed, which squeezed),
``fla/layers/rwkv7.py`` and ``fla/models/rwkv7/modeling_rwkv7.py`` (parameter shapes; the
``attn.x_x`` migration), the ``rwkv7-hf`` package's ``converter.py`` (the same names), and
llama.cpp ``convert_hf_to_gguf.py`` (``Rwkv7Model.modify_tensors``: both LoRA orientations,
``attn.x_x``, layer 0 with or without its unused v LoRA). Per layer i, ``blocks.i.X`` of ours
is ``model.layers.i.Y``:

==========================  ==========================================  =========================
ours (shape)                fla                                         how
==========================  ==========================================  =========================
ln0 / ln1 / ln2 [C]         pre_norm / attn_norm / ffn_norm [C]         as is (pre_norm: layer 0)
att.x_{r,w,k,v,a,g} [1,1,C] attn.x_* [1,1,C]                            as is
att.{w,a,v}0 [1,1,C]        attn.{w,a,v}_lora.lora.2.bias [C]           squeezed
att.{w,a,v,g}1 [C,D]        attn.*_lora.lora.0.weight [D,C]             transposed
att.{w,a,v,g}2 [D,C]        attn.*_lora.lora.2.weight [C,D]             transposed
att.k_k, att.k_a [1,1,C]    attn.k_k, attn.k_a [C]                      squeezed
att.r_k [H,N]               attn.r_k [H,N]                              as is
att.{receptance,key,        attn.{r,k,v,o}_proj.weight                  as is
value,output}.weight
att.ln_x [C]                attn.g_norm [C]                             as is
ffn.x_k [1,1,C]             ffn.x_k [C]                                 squeezed
ffn.key / ffn.value         ffn.key / ffn.value                         as is
emb / ln_out / head         model.embeddings / model.norm / lm_head     as is
==========================  ==========================================  =========================

fla has no v LoRA in layer 0 (the model never reads it): writers leave blocks.0.att.v0/v1/v2
out, readers use them when present and zeros otherwise. Older variants, still accepted by fla's
and llama.cpp's loaders: ``attn.x_x`` [6, C], the rows x_r, x_w, x_k, x_v, x_a, x_g; and LoRA
stored under our names (``attn.w1`` [C, D], ``attn.w0`` ...) in our orientation, not transposed.
"""
from __future__ import annotations

import re
from typing import NamedTuple

MIX_ORDER = "rwkvag"  # the rows of the fused attn.x_x
_PLAIN = {"ln0": "pre_norm", "ln1": "attn_norm", "ln2": "ffn_norm", "att.receptance": "attn.r_proj",
          "att.key": "attn.k_proj", "att.value": "attn.v_proj", "att.output": "attn.o_proj",
          "att.ln_x": "attn.g_norm", "ffn.key": "ffn.key", "ffn.value": "ffn.value"}
_TOP = {"emb.weight": "model.embeddings.weight", "ln_out.weight": "model.norm.weight",
        "ln_out.bias": "model.norm.bias", "head.weight": "lm_head.weight"}
_LORA = {"0": "lora.2.bias", "1": "lora.0.weight", "2": "lora.2.weight"}


class Source(NamedTuple):
    """Where one of our tensors is in an HF directory: ``name``, and ``how``: ``same``,
    ``reshape`` (a squeezed vector), ``transpose``, or ``row`` (row ``row`` of ``attn.x_x``)."""
    name: str
    how: str
    row: int = 0


def fla_source(key: str) -> Source:
    """The fla tensor of our ``key`` as fla's converter writes it."""
    if key in _TOP:
        return Source(_TOP[key], "same")
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", key)
    if m is None:
        raise KeyError(key)
    prefix, rest = f"model.layers.{m.group(1)}.", m.group(2)
    if lora := re.fullmatch(r"att\.([wavg])([012])", rest):
        kind, num = lora.groups()
        return Source(f"{prefix}attn.{kind}_lora.{_LORA[num]}", "reshape" if num == "0" else "transpose")
    if rest in ("att.k_k", "att.k_a", "ffn.x_k"):
        return Source(prefix + rest.replace("att.", "attn."), "reshape")
    if rest.startswith("att.x_") or rest == "att.r_k":
        return Source(prefix + rest.replace("att.", "attn."), "same")
    module, _, param = rest.rpartition(".")
    return Source(f"{prefix}{_PLAIN[module]}.{param}", "same")


def variant_sources(key: str) -> list[Source]:
    """Older layouts of our ``key`` (tried after ``fla_source``): a row of ``attn.x_x``, or
    LoRA under our own names in our orientation."""
    m = re.fullmatch(r"blocks\.(\d+)\.att\.(x_([rwkvag])|[wavg][012])", key)
    if m is None:
        return []
    prefix = f"model.layers.{m.group(1)}.attn."
    if m.group(3):
        return [Source(prefix + "x_x", "row", MIX_ORDER.index(m.group(3)))]
    return [Source(prefix + m.group(2), "reshape" if m.group(2)[1] == "0" else "same")]


def unused_in_fla(key: str) -> bool:
    """Our tensors fla's layout does not have: layer 0's v LoRA (never read by the model)."""
    return key in ("blocks.0.att.v0", "blocks.0.att.v1", "blocks.0.att.v2")
