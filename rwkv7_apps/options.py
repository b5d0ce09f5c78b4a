"""Command-line option groups shared by the commands (``rwkv7-generate``, ``rwkv7-serve``;
``rwkv7-convert`` the quantization options):
the model source, the engine and scheduler options and the sampling defaults, with the
checks and conversions that go with them."""
from __future__ import annotations

import argparse
from typing import Any

from rwkv7_core.quantization import DEFAULT_GROUP_SIZE, SCHEMES
from rwkv7_core.sampling import MAX_TOKENS_LIMIT, SCALAR_FIELDS, SamplingParams
from rwkv7_core.state import DEFAULT_STATE_DTYPE, STATE_DTYPES
from scheduler import SchedulerConfig

from .engines import BACKENDS, kernel_choices, random_model_names
from .grammar_options import add_grammar_options, apply_grammar_options

SAMPLING_OPTIONS = (*(f.name for f in SCALAR_FIELDS), "stop", "stop_tokens")
COMMAND_DEFAULTS = {"max_tokens": 128}
"""The commands' sampling defaults where they differ from ``SamplingParams``'s."""
DEFAULT_MAX_BATCH = 256


def int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_model_options(p: argparse.ArgumentParser) -> None:
    """--model / --random-model (exactly one)."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="PATH", help="checkpoint (.pth or .safetensors, official layout) or a "
                     "Hugging Face RWKV7ForCausalLM model directory")
    src.add_argument("--random-model", metavar="NAME", choices=random_model_names(),
                     help=f"a seeded random-weight model of this shape ({', '.join(random_model_names())}; "
                          "NAME-world: that shape with the World vocabulary, so text prompts work), "
                          "written once under $XDG_CACHE_HOME/rwkv7 (default ~/.cache/rwkv7)")


def add_quantization_options(p: argparse.ArgumentParser, note: str = "") -> None:
    """``--quantization none|int8|int4|fp8`` and ``--group-size N`` (int8 / int4 input channels per scale),
    as ``rwkv_jax.load`` / ``rwkv_torch_ref.load`` take them (checked there, at load)."""
    p.add_argument("--quantization", default="none", choices=SCHEMES,
                   help=f"weight-only quantization of the large projections (int8, int4: groups of --group-size input "
                        f"channels; fp8: e4m3, one scale per row; see docs/models.md){note}")
    p.add_argument("--group-size", type=int, default=None, metavar="N",
                   help=f"int8 / int4 only: input channels per scale, a multiple of 16 dividing every projection's "
                        f"width (default {DEFAULT_GROUP_SIZE}; a quantized checkpoint keeps its own)")


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """Backend, kernels, dtype and the scheduler options."""
    p.add_argument("--backend", default="jax", choices=BACKENDS)
    p.add_argument("--kernels", default="auto",
                   help="a value of the backend's Kernels (jax: rwkv_jax.Kernels, torch: rwkv_torch_ref.Kernels; "
                        "auto = the fastest available on this machine; mosaic needs jax >= 0.11; "
                        "checked by the backend)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--state-dtype", default=DEFAULT_STATE_DTYPE, choices=STATE_DTYPES,
                   help="dtype the wkv state is held in between steps (bfloat16/float16: half the bytes per "
                        "step, cached state and state file; see docs/models.md)")
    add_quantization_options(p)
    p.add_argument("--max-batch", type=int, default=None,
                   help="most sequences decoded together (default 256, or the largest of --buckets)")
    p.add_argument("--buckets", type=int_list, default=None, metavar="1,2,4,...",
                   help="decode batch sizes to compile (default: powers of two up to --max-batch)")
    p.add_argument("--prefix-cache-mb", type=float, default=0.0, metavar="N",
                   help="host memory for cached prompt-prefix states (0 = off); with it, each finished "
                        "request's final state is kept too, so a chat's next turn prefills only its new tokens")
    p.add_argument("--no-turn-cache", dest="turn_cache", action="store_false",
                   help="keep only prompt-prefix states, not finished requests' final states")
    p.add_argument("--precompile", action="store_true",
                   help="compile every bucket, the prefill shapes the policy uses and the logprob paths before the first step")
    p.add_argument("--prefill", default="auto", choices=("auto", "serial", "varlen", "mixed"),
                   help="prefill policy (default auto: one prompt per call when one waits, flattened "
                        "prompts when several do; see docs/batch-job.md)")
    p.add_argument("--chunk", type=int, default=256, metavar="K", help="prompt tokens per varlen/mixed call")
    p.add_argument("--max-tokens-limit", type=int, default=MAX_TOKENS_LIMIT, metavar="N",
                   help=f"most max_tokens a request may ask for (default {MAX_TOKENS_LIMIT}; more is refused)")
    add_grammar_options(p)


def add_replica_options(p, default: str, routing: str) -> None:
    """``--data-parallel N|auto`` (default ``default``; ``routing``: how requests pick a
    replica) and ``--ray``, as ``rwkv7_apps.scheduler_setup.build_scheduler`` reads them."""
    p.add_argument("--data-parallel", default=default, metavar="N|auto",
                   help=f"replicas, one engine + scheduler per device, {routing} (auto: every local "
                        f"accelerator, 1 on the CPU; default {default}; see docs/states-and-scale-out.md)")
    p.add_argument("--ray", metavar="ADDRESS|local",
                   help="run the --data-parallel replicas as Ray actors on this cluster ('local': start one "
                        "here); needs the [ray] extra")


def add_sampling_options(p: argparse.ArgumentParser, overridable_by: str, own: dict[str, Any] | None = None) -> None:
    """The sampling defaults (each overridable per request); ``own``: the command's defaults
    where they differ from COMMAND_DEFAULTS and ``SamplingParams``'s (rwkv7-serve: OpenAI's)."""
    s = p.add_argument_group(f"sampling defaults (each overridable per request in {overridable_by})")
    defaults = SamplingParams()
    for f in SCALAR_FIELDS:
        default = {**COMMAND_DEFAULTS, **(own or {})}.get(f.name, getattr(defaults, f.name))
        s.add_argument("--" + f.name.replace("_", "-"), type=f.kind, default=default, metavar="N",
                       help=f"{f.help} (default {default})")
    s.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop string (repeatable; needs the World tokenizer)")
    s.add_argument("--stop-tokens", type=int_list, default=None, metavar="0,...",
                   help="stop token ids (default 0, end of text)")


def check_engine_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fail at once (exit 2, clear message) on bad kernels, scheduler options or sampling defaults."""
    try:
        choices = kernel_choices(args.backend)
    except ValueError as e:
        p.error(str(e))
    if args.kernels not in choices:
        p.error(f"--kernels {args.kernels} is not available with --backend {args.backend} "
                f"(choose from {', '.join(choices)})")
    try:
        scheduler_config(args).validated()
    except ValueError as e:
        p.error(f"bad scheduler option: {e}")
    try:
        sampling_defaults(args)  # validates the sampling defaults
    except ValueError as e:
        p.error(f"bad sampling default: {e}")
    apply_grammar_options(p, args)


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    max_batch = args.max_batch if args.max_batch is not None else (
        max(args.buckets) if args.buckets else DEFAULT_MAX_BATCH)
    return SchedulerConfig(max_batch=max_batch, buckets=args.buckets,
                           prefix_cache_bytes=int(args.prefix_cache_mb * 2**20), turn_cache=args.turn_cache,
                           precompile=args.precompile,
                           prefill_policy=args.prefill, chunk=args.chunk, max_tokens_limit=args.max_tokens_limit)


def sampling_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The command line's sampling fields (validated), as a SamplingParams dict."""
    d = {k: getattr(args, k) for k in SAMPLING_OPTIONS if getattr(args, k) is not None}
    SamplingParams.from_dict(d).validate(max_tokens_limit=args.max_tokens_limit)
    return d
