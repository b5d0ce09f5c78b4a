"""What the CPU benchmarks share: the host's CPU model, and writing a result as JSON and Markdown."""
from __future__ import annotations

import json
import platform
from pathlib import Path


def cpu_model() -> str:
    """The host CPU's model name (/proc/cpuinfo), else what ``platform`` knows."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def write_results(json_path: Path, data: dict, lines: list[str]) -> None:
    """``data`` to json_path, ``lines`` (a Markdown table and its caption) beside it as .md, and printed."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    json_path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
