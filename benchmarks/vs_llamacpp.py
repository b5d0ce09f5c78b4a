"""This project's CPU engine against llama.cpp on the same checkpoint, side by side (not in CI).

Builds llama.cpp from a pinned source package from the registry (``LLAMACPP_SOURCE``: the
``llama-cpp-python`` sdist, which vendors llama.cpp; ``pip download --no-binary :all:``, no
downloaded binaries) with cmake into a cache directory outside the repository
(``$RWKV7_LLAMACPP_DIR``, default ``~/.cache/rwkv7-llamacpp``; niced, ``-j2``: ~11 min on 2
quiet cores, longer on a loaded machine), writes a random 0.1b-shape checkpoint, exports it
with ``rwkv7-convert --to hf`` and turns that directory into GGUF f32 / f16 / q8_0 files with
llama.cpp's own ``convert_hf_to_gguf.py`` (from the same source package; it imports the
vendored ``gguf-py`` and needs no extra package here). Then, in interleaved rounds (the order
alternating each round, so machine load hits both sides alike), with the same thread count:

- decode B = 1: our jitted forward step (state donated and carried, no sampling) in float32,
  int8 (groups of 64: the same 1.0625 bytes a weight as q8_0; with float32 rows, and with a
  bfloat16 model's rows, as q8_0's own product quantizes its rows to 8 bits) and bfloat16,
  against ``llama-bench -n`` (token generation, no sampling) on f32, q8_0 and f16;
- decode B = 32, aggregate tok/s: our step at B = 32 against ``llama-batched-bench``'s
  text-generation speed with 32 sequences;
- prefill, 512 tokens at B = 1: our forward over T = 512 against ``llama-bench -p 512``.

Each side's rate per round, their ratio per round, and the medians go to
``benchmarks/results/vs_llamacpp.{json,md}`` with the host, the versions and the commands;
the goals of issue 42 are checked on the median ratios. Also one logits comparison: the last
position's logits of llama.cpp's f32 model (``llama-debug --save-logits``) against ours on the
same tokens (``tests/integration/test_llamacpp_logits.py`` runs the same check on a fresh
random model whenever the build is there).

Run: ``PYTHONPATH=. python benchmarks/vs_llamacpp.py`` (``--build-only``, ``--rounds N``,
``--seconds S``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from benchmarks.results_io import cpu_model

LLAMACPP_VERSION = "0.3.36"
LLAMACPP_SOURCE = f"llama-cpp-python=={LLAMACPP_VERSION}"
TARGETS = ("llama-bench", "llama-batched-bench", "llama-debug")
THREADS = 2
PREFILL_T = 512
BATCH = 32
RESULTS = Path(__file__).resolve().parent / "results" / "vs_llamacpp.json"
GOALS = {  # issue 42, on the median ratio of one run's rounds: case -> least ratio
    "decode B=1 float32 vs f32": 1.0,
    "decode B=1 int8 vs q8_0": 1.2,
    "decode B=1 int8 bfloat16-rows vs q8_0": 1.2,
    f"prefill T={PREFILL_T} float32 vs f32": 1.0,
}
GOAL_BEST_B32 = 1.5  # our best format at B = 32 against llama.cpp's best
GOAL_B32_OVER_B1 = 10.0  # our best B = 32 rate over our best B = 1 rate


def cpu_fingerprint() -> str:
    """A short hash of this host's CPU model and instruction-set flags. A ``GGML_NATIVE`` build
    runs only on the CPU it was built for (one made on an AVX2 EPYC dies with SIGILL/SIGSEGV on
    an AVX-512 Xeon in its q8_0 paths), so each CPU gets its own build directory."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else platform.processor()
    wanted = [line for line in info.splitlines() if line.startswith(("model name", "flags"))][:2]
    return hashlib.sha1("\n".join(wanted or [platform.machine()]).encode()).hexdigest()[:12]


class LlamaCpp(NamedTuple):
    """Where a llama.cpp build lives: ``root`` the cache directory, ``source`` the vendored
    llama.cpp tree, ``build`` this host CPU's build directory, ``bin`` its built programs."""

    root: Path
    source: Path
    build_dir: Path

    @classmethod
    def at(cls, root: str | os.PathLike | None = None) -> "LlamaCpp":
        """The layout under ``root`` (default ``$RWKV7_LLAMACPP_DIR`` or ~/.cache/rwkv7-llamacpp)."""
        root = Path(root or os.environ.get("RWKV7_LLAMACPP_DIR", "~/.cache/rwkv7-llamacpp")).expanduser()
        source = root / "src" / f"llama_cpp_python-{LLAMACPP_VERSION}" / "vendor" / "llama.cpp"
        return cls(root, source, root / f"build-{cpu_fingerprint()}")

    @property
    def bin(self) -> Path:
        return self.build_dir / "bin"

    def program(self, name: str) -> Path:
        return self.bin / name

    def built(self) -> bool:
        return all(self.program(t).exists() for t in TARGETS) and self.converter.exists()

    @property
    def converter(self) -> Path:
        return self.source / "convert_hf_to_gguf.py"

    def fetch(self) -> None:
        """Download and unpack the pinned source package (once)."""
        if self.source.exists():
            return
        src = self.root / "src"
        src.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                        LLAMACPP_SOURCE, "-d", str(src)], check=True)
        archive = src / f"llama_cpp_python-{LLAMACPP_VERSION}.tar.gz"
        with tarfile.open(archive) as tar:
            tar.extractall(src, filter="data")

    def build(self, jobs: int = 2) -> None:
        """Configure (CPU only, this CPU's native ISA, shared libraries, no network features) and build
        ``TARGETS`` under nice."""
        self.fetch()
        build = self.build_dir
        nice = ["nice", "-n", "19"]
        if not (build / "CMakeCache.txt").exists():
            subprocess.run(nice + ["cmake", "-S", str(self.source), "-B", str(build), "-G", "Ninja",
                                   "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                                   "-DLLAMA_BUILD_SERVER=OFF", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=ON"],
                           check=True)
        subprocess.run(nice + ["cmake", "--build", str(build), "-j", str(jobs), "--target", *TARGETS], check=True)

    def to_gguf(self, hf_dir: Path, outtype: str, out: Path) -> Path:
        """llama.cpp's converter on an HF directory: ``out`` in ``outtype`` (f32, f16, q8_0, ...)."""
        if not out.exists():
            subprocess.run([sys.executable, str(self.converter), str(hf_dir), "--outtype", outtype,
                            "--outfile", str(out)], check=True, capture_output=True)
        return out

    def last_logits(self, gguf: Path, prompt: str, workdir: Path) -> tuple[np.ndarray, np.ndarray]:
        """(tokens int32 [T], float32 logits [V] of the last position) of ``prompt`` as
        llama.cpp tokenizes and runs it (``llama-debug --save-logits``)."""
        subprocess.run([str(self.program("llama-debug")), "-m", str(gguf), "-p", prompt, "-t", str(THREADS),
                        "--save-logits", "--logits-output-dir", str(workdir)],
                       check=True, capture_output=True, cwd=workdir)
        tokens = next(workdir.glob("llamacpp-*-tokens.bin"))
        logits = next(p for p in workdir.glob("llamacpp-*.bin") if not p.name.endswith("-tokens.bin"))
        return np.fromfile(tokens, np.int32), np.fromfile(logits, np.float32)


# ----------------------------------------------------------------------------- llama.cpp side
def llama_bench(lc: LlamaCpp, gguf: Path, *, prompt: int, gen: int, reps: int) -> float:
    """tok/s of ``llama-bench`` (mean over ``reps`` repetitions): generation when gen > 0,
    else prompt processing."""
    out = subprocess.run([str(lc.program("llama-bench")), "-m", str(gguf), "-t", str(THREADS), "-p", str(prompt),
                          "-n", str(gen), "-r", str(reps), "-o", "json"], check=True, capture_output=True, text=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def llama_batched(lc: LlamaCpp, gguf: Path, *, batch: int, gen: int) -> float:
    """Aggregate text-generation tok/s of ``llama-batched-bench`` with ``batch`` sequences."""
    out = subprocess.run([str(lc.program("llama-batched-bench")), "-m", str(gguf), "-t", str(THREADS),
                          "-tb", str(THREADS), "-c", str(batch * (gen + 8)), "-b", "2048", "-ub", "512",
                          "-npp", "1", "-ntg", str(gen), "-npl", str(batch), "--output-format", "jsonl"],
                         check=True, capture_output=True, text=True)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return float(rows[-1]["speed_tg"])


# ----------------------------------------------------------------------------- our side
def timed(fn: Callable[[], object], seconds: float, min_calls: int = 3) -> float:
    """Seconds per call of fn() after one warm-up call, over >= min_calls and >= seconds."""
    fn()
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls


class Ours:
    """Our JAX model on the checkpoint, with its decode and prefill executables compiled."""

    def __init__(self, checkpoint: Path, dtype: str, quantization: str, group_size: int | None, kernels: str):
        import rwkv_jax
        from rwkv_jax.engine import JaxEngine
        self.engine = JaxEngine(rwkv_jax.load(checkpoint, dtype=dtype, quantization=quantization,
                                              group_size=group_size, kernels=kernels))
        for B, T in ((1, 1), (BATCH, 1), (1, PREFILL_T)):
            self.engine.executables.get(("forward", (B, T, False)))

    def decode(self, B: int, seconds: float) -> float:
        import jax.numpy as jnp
        m, exe = self.engine.model, self.engine.executables.get(("forward", (B, 1, False)))
        tokens = jnp.asarray(np.random.default_rng(B).integers(0, m.config.vocab_size, (B, 1)), jnp.int32)
        box = [m.init_state(B)]

        def step() -> None:
            logits, box[0] = exe(m.params, tokens, box[0])
            logits.block_until_ready()
        return B / timed(step, seconds)

    def prefill(self, seconds: float) -> float:
        import jax.numpy as jnp
        m, exe = self.engine.model, self.engine.executables.get(("forward", (1, PREFILL_T, False)))
        tokens = jnp.asarray(np.random.default_rng(0).integers(0, m.config.vocab_size, (1, PREFILL_T)), jnp.int32)
        return PREFILL_T / timed(lambda: exe(m.params, tokens, m.init_state(1))[0].block_until_ready(), seconds, 2)

    def last_logits(self, tokens: np.ndarray) -> np.ndarray:
        logits, _ = self.engine.model.forward(tokens[None].astype(np.int32), self.engine.model.init_state(1))
        return np.asarray(logits)[0]


# ----------------------------------------------------------------------------- the run
FORMATS = {  # ours (dtype, quantization, group size) -> llama.cpp GGUF type
    "float32": (("float32", "none", None), "f32"),
    "int8": (("float32", "int8", 64), "q8_0"),
    # int8 weights with a bfloat16 model's rows (LoRA matrices and activations in bfloat16): q8_0's
    # own product quantizes its activations to 8 bits (ggml's q8_0 vec_dot_type), so neither side
    # multiplies float32 rows there
    "int8 bfloat16-rows": (("bfloat16", "int8", 64), "q8_0"),
    "bfloat16": (("bfloat16", "none", None), "f16"),
}


def run(lc: LlamaCpp, workdir: Path, rounds: int, seconds: float, gen: int, reps: int, kernels: str) -> dict:
    from rwkv7_apps.tools.convert import main as convert_main
    from rwkv7_core.config import named_config
    from rwkv7_core.random_weights import write_random_checkpoint

    pth, hf = workdir / "m.pth", workdir / "m-hf"
    if not pth.exists():
        write_random_checkpoint(pth, named_config("0.1b"), seed=0)
    if not hf.exists():
        convert_main([str(pth), "--to", "hf", "--out", str(hf)])
    ggufs = {f: lc.to_gguf(hf, t, workdir / f"m-{t}.gguf") for f, (_, t) in FORMATS.items()}
    ours = {f: Ours(pth, *spec, kernels) for f, (spec, _) in FORMATS.items()}

    with tempfile.TemporaryDirectory() as tmp:
        tokens, theirs = lc.last_logits(ggufs["float32"], "The quick brown fox jumps over the lazy dog.", Path(tmp))
    logits_diff = float(np.abs(ours["float32"].last_logits(tokens) - theirs).max())

    cases: dict[str, tuple[Callable[[], float], Callable[[], float]]] = {}
    for f, (_, t) in FORMATS.items():
        o, g = ours[f], ggufs[f]
        cases[f"decode B=1 {f} vs {t}"] = (lambda o=o: o.decode(1, seconds),
                                            lambda g=g: llama_bench(lc, g, prompt=0, gen=gen, reps=reps))
        cases[f"decode B={BATCH} {f} vs {t}"] = (lambda o=o: o.decode(BATCH, seconds),
                                                  lambda g=g: llama_batched(lc, g, batch=BATCH, gen=gen))
    for f in ("float32", "bfloat16"):
        o, g, t = ours[f], ggufs[f], FORMATS[f][1]
        cases[f"prefill T={PREFILL_T} {f} vs {t}"] = (lambda o=o: o.prefill(seconds),
                                                       lambda g=g: llama_bench(lc, g, prompt=PREFILL_T, gen=0, reps=reps))
    runs: dict[str, dict[str, list[float]]] = {c: {"ours": [], "llama.cpp": []} for c in cases}
    failures: dict[str, str] = {}  # case -> how llama.cpp's program failed (the case is then left out)
    for r in range(rounds):
        for case, (mine, theirs_fn) in cases.items():
            if case in failures:
                continue
            for side in (("ours", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "ours")):
                try:
                    runs[case][side].append(mine() if side == "ours" else theirs_fn())
                except subprocess.CalledProcessError as e:
                    failures[case] = f"{Path(e.cmd[0]).name} exited with {e.returncode}: {e.stderr[-300:]!r}"
                    print(f"{case}: left out, {failures[case]}", flush=True)
                    break
        print(f"round {r + 1}: " + "; ".join(f"{c} {v['ours'][r]:.1f} / {v['llama.cpp'][r]:.1f}"
                                              for c, v in runs.items() if c not in failures), flush=True)
    for case in failures:
        del runs[case]
    return {"host": host(), "llamacpp_source": LLAMACPP_SOURCE, "threads": THREADS, "rounds": rounds,
            "kernels": {f: o.engine.model.kernels.value for f, o in ours.items()},
            "seconds_per_measurement": seconds, "llama_bench_gen_tokens": gen, "llama_bench_reps": reps,
            "logits_max_abs_diff_f32": logits_diff, "logits_tokens": tokens.tolist(),
            "runs": runs, "llamacpp_failures": failures, "load_average_at_end": os.getloadavg()}


def host() -> dict:
    import jax
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "jax": jax.__version__, "numpy": np.__version__, "cpu_fingerprint": cpu_fingerprint()}


def summarise(out: dict) -> dict:
    """Medians per side, per-round ratios and their median, and the goals."""
    table = {}
    for case, sides in out["runs"].items():
        ratios = [a / b for a, b in zip(sides["ours"], sides["llama.cpp"])]
        table[case] = {"ours_median": statistics.median(sides["ours"]),
                       "llamacpp_median": statistics.median(sides["llama.cpp"]),
                       "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    best = {side: max(v[f"{side}_median"] for c, v in table.items() if c.startswith(f"decode B={BATCH} "))
            for side in ("ours", "llamacpp")}
    best_b1 = max(v["ours_median"] for c, v in table.items() if c.startswith("decode B=1 "))
    goals = {case: {"ratio": table[case]["ratio_median"] if case in table else None, "goal": goal}
             for case, goal in GOALS.items()}  # None: llama.cpp's side failed, nothing to compare
    goals[f"decode B={BATCH} our best vs its best"] = {"ratio": best["ours"] / best["llamacpp"], "goal": GOAL_BEST_B32}
    goals["ours B=32 best / B=1 best"] = {"ratio": best["ours"] / best_b1, "goal": GOAL_B32_OVER_B1}
    for g in goals.values():
        g["met"] = g["ratio"] is not None and g["ratio"] >= g["goal"]
    # the batching factor of each format on its own (the goal above divides across formats)
    per_format = {f: {side: table[f"decode B={BATCH} {f} vs {t}"][f"{side}_median"]
                      / table[f"decode B=1 {f} vs {t}"][f"{side}_median"] for side in ("ours", "llamacpp")}
                  for f, (_, t) in FORMATS.items()
                  if f"decode B={BATCH} {f} vs {t}" in table and f"decode B=1 {f} vs {t}" in table}
    return {"table": table, "goals": goals, "b32_over_b1_per_format": per_format}


def markdown(out: dict, summary: dict) -> str:
    h = out["host"]
    kernels = ", ".join(sorted(set(out.get("kernels", {}).values()))) or "xla"
    lines = [f"Ours (JAX, XLA:CPU, kernels {kernels}) vs llama.cpp ({out['llamacpp_source']}, built here), same random 0.1b "
             f"checkpoint, {out['threads']} threads each, {out['rounds']} interleaved rounds; host {h['cpu']}, "
             f"{h['cpus']} CPUs, jax {h['jax']}; load average at the end "
             f"{', '.join(f'{x:.1f}' for x in out['load_average_at_end'])} (a shared machine: ratios per round "
             "matter more than the rates).", "",
             "| case | ours tok/s (median) | llama.cpp tok/s (median) | ratio (median of rounds) | min - max |",
             "|---|---|---|---|---|"]
    for case, v in summary["table"].items():
        lines.append(f"| {case} | {v['ours_median']:.1f} | {v['llamacpp_median']:.1f} | **{v['ratio_median']:.2f}** "
                     f"| {v['ratio_min']:.2f} - {v['ratio_max']:.2f} |")
    lines += ["", "| goal | ratio | needed | met |", "|---|---|---|---|"]
    for name, g in summary["goals"].items():
        ratio = "-" if g["ratio"] is None else f"{g['ratio']:.2f}"
        lines.append(f"| {name} | {ratio} | >= {g['goal']} | {'yes' if g['met'] else 'no'} |")
    if summary.get("b32_over_b1_per_format"):
        lines += ["", "B=32 / B=1 per format, ours (llama.cpp's): " + ", ".join(
            f"{f} {r['ours']:.1f}x ({r['llamacpp']:.1f}x)" for f, r in summary["b32_over_b1_per_format"].items()) + "."]
    for case, why in out.get("llamacpp_failures", {}).items():
        lines.append(f"| {case} | - | llama.cpp failed: {why} | - | - |")
    lines += ["", f"Last-position logits, llama.cpp f32 vs ours float32 on the same {len(out['logits_tokens'])} "
              f"tokens: max |difference| {out['logits_max_abs_diff_f32']:.2e}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=None, help="llama.cpp cache directory (default $RWKV7_LLAMACPP_DIR or "
                                                  "~/.cache/rwkv7-llamacpp)")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="our side: seconds per measurement")
    ap.add_argument("--gen", type=int, default=32, help="llama.cpp: tokens generated per measurement")
    ap.add_argument("--reps", type=int, default=2, help="llama-bench repetitions per measurement")
    ap.add_argument("--kernels", default="auto", help="our kernels (rwkv_jax.Kernels; auto: native on the CPU "
                                                         "once its self-check passes)")
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    lc = LlamaCpp.at(args.cache)
    if not lc.built():
        lc.build()
    if args.build_only:
        return
    work = lc.root / "work"
    work.mkdir(parents=True, exist_ok=True)
    out = run(lc, work, args.rounds, args.seconds, args.gen, args.reps, args.kernels)
    summary = summarise(out)
    out.update(summary)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    text = markdown(out, summary)
    args.output.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {args.output} and {args.output.with_suffix('.md')}")


if __name__ == "__main__":
    main()
