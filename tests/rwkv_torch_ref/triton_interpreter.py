"""Can this Triton's interpreter run a loop bounded by a runtime argument? (not a test module)

Triton 3.6's interpreter turns a tensor into a loop bound with ``int(array)`` on a
1-element array, which numpy >= 2.5 refuses ("only 0-dimensional arrays can be converted
to Python scalars"); Triton 3.7+ squeezes first. That is the GPU machine's stack (triton
3.6, numpy 2.5.2). The interpreted wkv7_seq tests then skip with the reason; the kernel is
still compiled for sm_90a there (test_triton_aot.py) and run on the device by gpu_check.py.
Import after TRITON_INTERPRET=1 is set."""
from __future__ import annotations

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


def _probe() -> str | None:
    out = torch.zeros(1, dtype=torch.int32)
    try:
        _count_kernel[(1,)](out, 3)
    except Exception as e:  # the interpreter's failure is the answer
        return (f"triton {triton.__version__}'s interpreter cannot run a runtime-bounded loop under numpy "
                f"{np.__version__} ({type(e).__name__}: {str(e)[:120]})")
    return None if int(out[0]) == 3 else f"triton {triton.__version__}'s interpreter counted {int(out[0])} of 3"


RUNTIME_LOOPS_BROKEN = _probe()
"""None where interpreted kernels can loop over a runtime bound, else why not."""
