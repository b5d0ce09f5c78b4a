"""The applications: the commands and what they share.

- ``generate/``: ``rwkv7-generate`` (also ``python -m scheduler``), batch generation JSONL -> JSONL;
- ``serve/``: ``rwkv7-serve``, the OpenAI-compatible HTTP server;
- ``tools/``: ``rwkv7-convert``, ``rwkv7-random-checkpoint``, ``rwkv7-gpu-compile``, ``rwkv7-bench``;
- shared by the commands: ``options`` (option groups), ``engines`` (random models by name,
  one engine per backend), ``scheduler_setup`` (one scheduler, replicas or Ray actors),
  ``states`` (saved states).

The replica layer (several schedulers as one, on local devices or Ray actors) is
``scheduler/replicas/``.

Imports every other project package; none imports it.
"""
