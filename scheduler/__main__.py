"""``python -m scheduler``: the batch generation command, ``rwkv7-generate``.

The command lives in the applications package, which the scheduler never imports; this
entry point only runs it as a program (by module name), so no import edge points back.
"""
import runpy

runpy.run_module("rwkv7_apps.generate", run_name="__main__", alter_sys=True)
