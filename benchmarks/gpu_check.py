"""One-command first GPU run (issue 4): every kernel path checked on the device first, then
decode speed, then the rest while a time budget lasts (benchmarks/gpu_checks/ holds the
sections; this file starts the clock and runs them).

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/gpu_check.py --out DIR [--smoke] [--cache-dir DIR]
"""
from __future__ import annotations

import time

START = time.perf_counter()  # the budget counts the imports too

import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# other processes on the GPU (the torch parity child, the HTTP server) need memory too: allocate on demand
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from benchmarks.gpu_checks.runner import main

if __name__ == "__main__":
    main(start=START)
