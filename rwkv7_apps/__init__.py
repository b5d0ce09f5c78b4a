"""The applications: the commands and what only they need (JSONL I/O, run metrics, plots).

- ``generate``: ``rwkv7-generate`` (also ``python -m scheduler``), batch generation JSONL -> JSONL;
- ``random_checkpoint``: ``rwkv7-random-checkpoint``;
- ``serving_bench``: ``rwkv7-bench``, the serving benchmark of the prefill policies;
- ``engines``: random models by name and one engine per backend.

Imports every other project package; none imports it.
"""
