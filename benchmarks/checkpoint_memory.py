"""Peak host memory while loading a random 1.5b-shape bfloat16 checkpoint as ``.pth``, as our
``.safetensors`` and as a Hugging Face model directory (goal: at most 1.3x the file size).

The checkpoint (about 3 GB per format) is written to a temporary directory (``--dir``) and
deleted afterwards. Each measurement runs in a fresh process, which imports what it needs,
records its resident set (the baseline), then either

- ``read``: ``read_checkpoint`` and every tensor read once and dropped (what a model build
  does with the lazy tensors), or
- ``jax``: ``rwkv_jax.load(dtype="bfloat16")`` on the CPU (the weights then live in the process),

and reports the peak resident set above the baseline (``VmHWM``; anonymous and file-backed
pages both count) and the peak of anonymous memory alone (``RssAnon``, sampled every 5 ms):
file-backed pages of a memory map are page cache the kernel can drop, anonymous ones are
held. Prints a table and writes benchmarks/results/checkpoint_memory.json.

    .venv/bin/python benchmarks/checkpoint_memory.py [--shape 1.5b] [--dir /tmp] [--stages read,jax]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def measure(path: str, stage: str) -> dict:
    """In this (fresh) process: (peak RSS, peak anonymous) above the baseline, in bytes."""
    from rwkv7_core import read_checkpoint
    if stage == "jax":
        import rwkv_jax
    base_rss, base_anon = status_kb("VmRSS"), status_kb("RssAnon")
    peak_anon, done = [base_anon], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak_anon[0] = max(peak_anon[0], status_kb("RssAnon"))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    if stage == "read":
        tensors, _ = read_checkpoint(path)
        for key in tensors:
            tensors[key]
    else:
        rwkv_jax.load(path, dtype="bfloat16")  # the peak is while it loads; the model is let go at once
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    return {"peak_rss_bytes": (status_kb("VmHWM") - base_rss) * 1024,
            "peak_anon_bytes": (max(peak_anon[0], status_kb("RssAnon")) - base_anon) * 1024, "seconds": seconds}


def file_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() else path.stat().st_size


def write_formats(shape: str, directory: Path) -> dict[str, Path]:
    """The random bf16 checkpoint as .pth, .safetensors and an HF directory (2 GB shards)."""
    from rwkv7_core import named_config, random_tensors, write_checkpoint
    from rwkv7_core.hf_checkpoint import write_hf_dir

    config = named_config(shape)
    tensors = random_tensors(config, seed=0, dtype="bfloat16")
    paths = {"pth": directory / "model.pth", "safetensors": directory / "model.safetensors",
             "hf": directory / "model-hf"}
    write_checkpoint(paths["pth"], tensors)
    write_checkpoint(paths["safetensors"], tensors)
    write_hf_dir(paths["hf"], tensors, config, "bfloat16", max_shard_bytes=2 * 2**30)
    return paths


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="1.5b")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the temporary checkpoints go")
    p.add_argument("--stages", default="read,jax")
    p.add_argument("--measure", nargs=2, metavar=("PATH", "STAGE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    work = Path(tempfile.mkdtemp(prefix="ckpt-mem-", dir=args.dir))
    rows = []
    try:
        t0 = time.perf_counter()
        paths = write_formats(args.shape, work)
        print(f"wrote {args.shape} bf16 in three formats ({time.perf_counter() - t0:.0f} s)", flush=True)
        for stage in args.stages.split(","):
            for fmt, path in paths.items():
                env = dict(os.environ, JAX_PLATFORMS="cpu")
                out = subprocess.run([sys.executable, __file__, "--measure", str(path), stage], env=env,
                                     capture_output=True, text=True, check=True).stdout
                row = {"format": fmt, "stage": stage, "file_bytes": file_size(path), **json.loads(out.splitlines()[-1])}
                row["rss_over_file"] = row["peak_rss_bytes"] / row["file_bytes"]
                row["anon_over_file"] = row["peak_anon_bytes"] / row["file_bytes"]
                rows.append(row)
                print(f"{fmt:12s} {stage:5s} file {row['file_bytes'] / 2**30:5.2f} GiB  peak RSS "
                      f"{row['rss_over_file']:.2f}x  peak anon {row['anon_over_file']:.2f}x  "
                      f"{row['seconds']:.1f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "checkpoint_memory.json"
    out.write_text(json.dumps({"shape": args.shape, "dtype": "bfloat16", "goal": "peak <= 1.3x file size",
                               "machine": platform.platform(), "cpus": os.cpu_count(), "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
