"""Download what an offline machine needs to install this project: a wheelhouse.

    python tools/wheelhouse.py --python-version 3.12 --out wheelhouse [--extras test]
        [--platform manylinux_2_28_x86_64] [--image tools/gpu_image_packages.txt | --image none]

Resolves the project's dependencies (and the named extras) for the target Python and
platform (binary wheels only), leaves out the packages the target image already holds
(``--image``: a file of names, one a line; by default the CUDA image of the lent H200
machine, which has jax, torch, numpy, flax...), and downloads the project's own wheel plus
the rest into ``--out``. On the target:

    pip install --no-index --find-links wheelhouse "rwkv7-engine[EXTRAS]"

``wheelhouse/MANIFEST.txt`` lists each wheel with its size, and what was left to the image.
Needs network here, pip >= 23 and nothing else.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_IMAGE = Path(__file__).resolve().with_name("gpu_image_packages.txt")
PROJECT = "rwkv7-engine"
# Each manylinux tag is matched exactly by pip: list the ones wheels of our dependencies use.
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64"]


def normalize(name: str) -> str:
    """A distribution name in PEP 503 form (``Jinja2`` -> ``jinja2``, ``ml_dtypes`` -> ``ml-dtypes``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages(path: str) -> set[str]:
    """Normalized names listed in an image file ('none': the empty set)."""
    if path == "none":
        return set()
    lines = Path(path).read_text().splitlines()
    return {normalize(line.strip()) for line in lines if line.strip() and not line.startswith("#")}


def target_args(python_version: str, platforms: list[str]) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for p in platforms:
        args += ["--platform", p]
    return args


def pip(*args: str) -> None:
    """Run pip (this interpreter's); a failure stops with pip's own message."""
    run = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"pip {args[0]} failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}")


def resolve(project_wheel: Path, extras: str, target: list[str]) -> dict[str, str]:
    """{normalized name: version} of everything installing the project (with extras) pulls in."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        spec = f"{PROJECT}[{extras}] @ {project_wheel.resolve().as_uri()}" if extras else str(project_wheel)
        pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
            "--target", str(Path(tmp) / "t"), *target, spec)
        items = json.loads(report.read_text())["install"]
    return {normalize(i["metadata"]["name"]): i["metadata"]["version"] for i in items}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python-version", required=True, help="target Python, e.g. 3.12")
    ap.add_argument("--out", default="wheelhouse", help="folder for the wheels")
    ap.add_argument("--extras", default="", help="project extras to include, e.g. test")
    ap.add_argument("--platform", action="append", help=f"wheel platform tags (default: {PLATFORMS[0]} and older)")
    ap.add_argument("--image", default=str(DEFAULT_IMAGE),
                    help="file naming the packages the target already has, or 'none'")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pip("wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(ROOT))
    project_wheel = max(out.glob("rwkv7_engine-*.whl"), key=lambda p: p.stat().st_mtime)
    target = target_args(args.python_version, args.platform or PLATFORMS)
    wanted = resolve(project_wheel, args.extras, target)
    wanted.pop(PROJECT, None)
    provided = image_packages(args.image)
    fetch = {n: v for n, v in wanted.items() if n not in provided}
    if fetch:
        pip("download", "--no-deps", "--quiet", "--dest", str(out), *target,
            *(f"{n}=={v}" for n, v in sorted(fetch.items())))
    wheels = sorted(out.glob("*.whl"))
    lines = [f"{w.name}\t{w.stat().st_size}" for w in wheels]
    lines += [f"# from the image: {n}=={v}" for n, v in sorted(wanted.items()) if n in provided]
    (out / "MANIFEST.txt").write_text("\n".join(lines) + "\n")
    total = sum(w.stat().st_size for w in wheels)
    extras = f"[{args.extras}]" if args.extras else ""
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {out} ({len(wanted) - len(fetch)} packages left to the "
          f"image); install with: pip install --no-index --find-links {out} \"{PROJECT}{extras}\"")


if __name__ == "__main__":
    main()
