"""Can this Triton's interpreter run a loop bounded by a runtime argument?

Triton 3.6's interpreter turns a tensor into a loop bound with ``int(array)`` on a
1-element array, which numpy >= 2.5 refuses ("only 0-dimensional arrays can be converted
to Python scalars"); Triton 3.7+ squeezes first. That is the GPU machine's stack (triton
3.6, numpy 2.5.2): there the interpreted wkv7_seq (tests, ``gpu_check.py --smoke``) is
skipped with the reason, while compiled kernels (sm_90a, the GPU) are unaffected. Ask only
where the kernels are interpreted (``interpreted()``)."""
from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def _count_kernel(out_ptr, n):
    total = 0
    for _ in range(n):
        total += 1
    tl.store(out_ptr, total)


@functools.lru_cache(maxsize=None)
def runtime_loops_broken() -> str | None:
    """None where interpreted kernels can loop over a runtime bound, else why not."""
    out = torch.zeros(1, dtype=torch.int32)
    try:
        _count_kernel[(1,)](out, 3)
    except Exception as e:  # the interpreter's failure is the answer
        return (f"triton {triton.__version__}'s interpreter cannot run a runtime-bounded loop under numpy "
                f"{np.__version__} ({type(e).__name__}: {str(e)[:120]})")
    return None if int(out[0]) == 3 else f"triton {triton.__version__}'s interpreter counted {int(out[0])} of 3"
