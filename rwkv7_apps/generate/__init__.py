"""``rwkv7-generate``: batch generation, JSONL in -> JSONL out.

- ``cli``: the command line and the run (``main``);
- ``run``: the loop of one run (requests in, results out, counts);
- ``jsonl_io``: reading requests and writing results (the one writer, resume keys);
- ``metrics``: the run's metrics, summary table and plot.
"""
