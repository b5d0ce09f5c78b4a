"""Every Triton kernel of rwkv_torch_ref compiles ahead of time for sm_90a (H100/H200) on this
CPU-only machine, at the 2.9b head count and with each state dtype: a real cubin, its
resources read back with cuobjdump, no spills, shared memory under the opt-in limit (Triton
itself checks that only at load time, so check_resources does)."""
from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # as test_triton_kernels: this process runs kernels interpreted

import pytest  # noqa: E402

from rwkv7_core.state import STATE_DTYPES  # noqa: E402
from rwkv_torch_ref import triton_aot  # noqa: E402


@pytest.mark.parametrize("name", sorted(triton_aot.KERNELS))
def test_kernel_compiles_for_sm90_without_spills(name):
    kernels = {dtype: triton_aot.compile_kernel(name, H=40, N=64, state_dtype=dtype) for dtype in STATE_DTYPES}
    for dtype, kernel in kernels.items():
        assert kernel.state_dtype == dtype and kernel.cubin[:4] == b"\x7fELF"
        assert 0 < kernel.registers <= 255
        assert kernel.shared_bytes > 0 and kernel.launch_shared_bytes > 0
        assert triton_aot.check_resources(kernel) == []
    assert len({kernel.cubin for kernel in kernels.values()}) == len(STATE_DTYPES)  # each its own loads/stores
    with pytest.raises(ValueError, match="state_dtype 'float64' not supported"):
        triton_aot.compile_kernel(name, H=40, N=64, state_dtype="float64")


def test_check_resources_flags_shared_memory_over_the_limit_and_spills():
    kernel = triton_aot.compile_kernel("wkv7_seq", H=3, N=64)
    assert triton_aot.check_resources(kernel) == []
    over = dataclasses.replace(kernel, launch_shared_bytes=triton_aot.SHARED_MEMORY_OPTIN + 1)
    assert "shared memory" in triton_aot.check_resources(over)[0]
    spilling = dataclasses.replace(kernel, stack_bytes=64, local_bytes=64)
    assert "stack" in triton_aot.check_resources(spilling)[0]
    with pytest.raises(ValueError, match="unknown Triton kernel"):
        triton_aot.compile_kernel("wkv9", H=3, N=64)
