"""The small commands: ``convert`` (``rwkv7-convert``), ``random_checkpoint``
(``rwkv7-random-checkpoint``), ``gpu_compile`` (``rwkv7-gpu-compile``, deviceless GPU
compiles) and ``serving_bench`` (``rwkv7-bench``, the serving benchmark of the prefill
policies; a console script, so it ships in the package)."""
