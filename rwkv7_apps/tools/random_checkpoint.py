"""``rwkv7-random-checkpoint``: write a seeded random-weight checkpoint in the official layout."""
from __future__ import annotations

import argparse

from rwkv7_core.checkpoint import SUPPORTED_DTYPES
from rwkv7_core.config import NAMED_CONFIGS, named_config
from rwkv7_core.random_weights import write_random_checkpoint


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="rwkv7-random-checkpoint", description=__doc__)
    p.add_argument("--shape", default="tiny", choices=sorted(NAMED_CONFIGS))
    p.add_argument("--out", required=True, help="output path ending in .pth or .safetensors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=sorted(SUPPORTED_DTYPES))
    args = p.parse_args(argv)
    config = write_random_checkpoint(args.out, named_config(args.shape), args.seed, args.dtype)
    print(f"wrote {args.out}: {config}")


if __name__ == "__main__":
    main()
