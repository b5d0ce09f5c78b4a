"""``rwkv7-convert``: rewrite a checkpoint in another format (numpy only, but ``.pth`` needs torch).

The source is anything ``--model`` takes (``.pth``, our ``.safetensors``, a Hugging Face model
directory); ``--to hf`` writes an HF ``RWKV7ForCausalLM`` directory (fla's layout, with the
World vocabulary file for 65536-token models), ``--to safetensors`` / ``--to pth`` a file in
the official layout. Tensors keep their dtype unless ``--dtype`` casts them.
``--quantization int8|int4|fp8`` (``--to safetensors`` only) writes a quantized checkpoint: the large
projections as q plus float32 scales, the scheme in the file's metadata (``rwkv7_core.quantization``);
load it with the same ``--quantization``. ``--calibration FILE`` (int8 / int4) rounds with GPTQ, or
picks the scales by a search (``--calibration-method``), on the float model's activations over
that text (``rwkv7_apps.tools.calibrate``); the file loads the same way.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from rwkv7_core.checkpoint import SUPPORTED_DTYPES, CheckpointError, read_checkpoint, write_checkpoint
from rwkv7_core.hf_checkpoint import VOCAB_FILE, write_hf_dir
from rwkv7_core.quantization import GROUPED, metadata, quantize_tensors, spec_for, stored_spec
from rwkv7_core.tokenizer import WORLD_VOCAB_SIZE, world_vocab_file

from ..options import add_quantization_options
from .calibrate import DEFAULT_TOKENS, METHODS, calibrated_tensors, calibration_tokens

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rwkv7-convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="a .pth or .safetensors checkpoint, or a Hugging Face model directory")
    p.add_argument("--to", required=True, choices=["hf", "safetensors", "pth"])
    p.add_argument("--out", required=True, help="output directory (--to hf) or file (.safetensors / .pth)")
    p.add_argument("--dtype", choices=sorted(SUPPORTED_DTYPES), help="cast every tensor (default: keep)")
    p.add_argument("--max-shard-mb", type=float, default=4096,
                   help="--to hf: shards of at most this size (default 4096; a shard is built in memory)")
    add_quantization_options(p, "; --to safetensors only")
    p.add_argument("--calibration", metavar="FILE",
                   help="int8 / int4: calibrate on this text (UTF-8; token ids separated by whitespace for a model "
                        "without the World vocabulary) instead of rounding to nearest")
    p.add_argument("--calibration-method", choices=METHODS, default=METHODS[0],
                   help="gptq (default): round each projection compensating its error with its inputs' statistics; "
                        "search: pick each group's scale by its inputs' mean squares")
    p.add_argument("--calibration-tokens", type=int, default=DEFAULT_TOKENS, metavar="N",
                   help=f"use at most the first N tokens of --calibration (default {DEFAULT_TOKENS})")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    suffix = {"safetensors": ".safetensors", "pth": ".pth"}.get(args.to)
    if suffix and Path(args.out).suffix != suffix:
        parser.error(f"--to {args.to}: --out must end in {suffix}")
    if args.quantization != "none" and args.to != "safetensors":
        parser.error("--quantization needs --to safetensors (the scheme travels in its metadata)")
    if args.calibration and args.quantization not in GROUPED:
        parser.error("--calibration needs --quantization int8 or int4")
    try:
        quant = spec_for(args.quantization, args.group_size)
        tensors, config = read_checkpoint(args.source)
        if stored_spec(tensors.metadata, args.source) is not None:
            raise CheckpointError(f"{args.source!r} is already quantized; convert its float checkpoint")
        dtype = args.dtype or next(n for n, d in SUPPORTED_DTYPES.items() if np.dtype(d) == tensors.dtype("emb.weight"))
        if args.to == "hf":
            source_vocab = Path(args.source) / VOCAB_FILE
            vocab = (source_vocab if source_vocab.is_file() else
                     world_vocab_file() if config.vocab_size == WORLD_VOCAB_SIZE else None)
            shard = int(args.max_shard_mb * 2**20) if args.max_shard_mb else None
            write_hf_dir(args.out, tensors, config, dtype, shard, vocab)
        else:
            target = SUPPORTED_DTYPES[dtype]
            cast = {k: tensors[k].astype(target) for k in tensors}
            if quant is None:
                write_checkpoint(args.out, cast)
            elif args.calibration:
                tokens = calibration_tokens(args.calibration, config.vocab_size, args.source, args.calibration_tokens)
                write_checkpoint(args.out, calibrated_tensors(args.source, cast, quant, tokens,
                                                              args.calibration_method), metadata(quant))
            else:
                write_checkpoint(args.out, quantize_tensors(cast, quant), metadata(quant))
    except (CheckpointError, OSError) as e:
        print(f"rwkv7-convert: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    calibrated = f", {args.calibration_method} on {args.calibration}" if args.calibration else ""
    quantized = "" if quant is None else f", {quant.describe()} projections{calibrated}"
    print(f"wrote {args.out} ({args.to}, {dtype}{quantized}): {config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
