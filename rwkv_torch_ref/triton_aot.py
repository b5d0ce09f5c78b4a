"""Ahead-of-time compile of the Triton kernels for a GPU on a machine without one.

``compile_kernel(name, H, N, state_dtype=...)`` runs Triton's whole pipeline (ttir, ttgir, llir, PTX, cubin)
for ``GPUTarget("cuda", 90, 32)`` (an H100/H200, sm_90a) and reads the cubin's resources
with the ``cuobjdump`` the triton wheel ships (``cuobjdump --dump-resource-usage``): Triton
itself leaves ``n_regs`` / ``n_spills`` unset without a GPU, and it checks shared memory
only when a kernel is loaded, so ``check_resources`` compares it with the target's opt-in
limit explicitly. The state pointers (``s_in_ptr``, ``s_out_ptr``) take the state dtype
(``rwkv7_core.state.STATE_DTYPES``): a 16-bit state compiles its own cubin, loading and
storing 16-bit values around the float32 update.
"""
from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from rwkv7_core.state import DEFAULT_STATE_DTYPE, check_state_dtype

from .triton_kernels import interpreted, wkv7_seq, wkv7_step

H100_H200 = GPUTarget("cuda", 90, 32)
SHARED_MEMORY_OPTIN = 232448  # bytes per block an H100/H200 kernel may opt in to
KERNELS = {"wkv7_step": wkv7_step, "wkv7_seq": wkv7_seq}  # name -> module with KERNEL, constexprs(H, N)
STATE_POINTERS = ("s_in_ptr", "s_out_ptr")
POINTER_TYPES = {"float32": "*fp32", "bfloat16": "*bf16", "float16": "*fp16"}  # Triton's names


@dataclass(frozen=True)
class CompiledKernel:
    """One AOT-compiled kernel: registers, stack and local bytes per thread, shared bytes per
    block (the cubin's static shared memory and Triton's launch-time shared memory), the
    PTX version and the cubin."""

    name: str
    state_dtype: str
    num_warps: int
    registers: int
    stack_bytes: int
    local_bytes: int
    shared_bytes: int
    launch_shared_bytes: int
    ptx_version: str
    cubin: bytes

    @property
    def spill_bytes(self) -> int:
        """Local memory per thread (spills live there; these kernels use no local arrays)."""
        return self.local_bytes


def signature(fn, constexprs: dict, state_dtype: str = DEFAULT_STATE_DTYPE) -> dict:
    """Triton signature of a kernel: the state pointers (``STATE_POINTERS``) of `state_dtype`,
    other ``*_ptr`` arguments float32 pointers, constexprs as such, every other argument int32."""
    state = POINTER_TYPES[check_state_dtype(state_dtype)]
    return {a: "constexpr" if a in constexprs else state if a in STATE_POINTERS else "*fp32" if a.endswith("_ptr")
            else "i32" for a in fn.arg_names}


def _bin(tool: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)


def compile_kernel(name: str, H: int, N: int, num_warps: int = 4, target: GPUTarget = H100_H200,
                   state_dtype: str = DEFAULT_STATE_DTYPE) -> CompiledKernel:
    """AOT-compile kernel ``name`` (a key of KERNELS) for H heads of size N with a state of
    `state_dtype` (ValueError naming the choices for another). In a process whose
    kernels were built for the interpreter (TRITON_INTERPRET=1: Triton cannot compile for a GPU
    there) the compile runs in a fresh Python process."""
    if name not in KERNELS:
        raise ValueError(f"unknown Triton kernel {name!r}; choose one of {sorted(KERNELS)}")
    if interpreted() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return _compile_in_subprocess(name, H, N, num_warps, target, check_state_dtype(state_dtype))
    module = KERNELS[name]
    consts = module.constexprs(H, N)
    with tempfile.TemporaryDirectory(prefix="rwkv7_triton_") as cache:
        os.environ.setdefault("TRITON_CACHE_DIR", cache)
        kernel = triton.compile(ASTSource(module.KERNEL, signature=signature(module.KERNEL, consts, state_dtype),
                                           constexprs=consts),
                                target=target, options={"num_warps": num_warps})
        cubin = os.path.join(cache, "kernel.cubin")
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run([_bin("cuobjdump"), "--dump-resource-usage", cubin], capture_output=True, text=True,
                               check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    if m is None:
        raise RuntimeError(f"cuobjdump gave no resource usage for {name}: {usage[-300:]}")
    version = re.search(r"^\.version (\S+)", kernel.asm["ptx"], re.M)
    return CompiledKernel(name=name, state_dtype=state_dtype, num_warps=num_warps, registers=int(m[1]), stack_bytes=int(m[2]),
                          local_bytes=int(m[4]), shared_bytes=int(m[3]), launch_shared_bytes=int(kernel.metadata.shared),
                          ptx_version=version[1] if version else "", cubin=kernel.asm["cubin"])


def _compile_in_subprocess(name, H, N, num_warps, target, state_dtype) -> CompiledKernel:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    code = ("import pickle, sys; from rwkv_torch_ref import triton_aot; from triton.backends.compiler import GPUTarget; "
            f"k = triton_aot.compile_kernel({name!r}, {H}, {N}, {num_warps}, "
            f"GPUTarget({target.backend!r}, {target.arch!r}, {target.warp_size}), {state_dtype!r}); sys.stdout.buffer.write(pickle.dumps(k))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env)
    if run.returncode:
        raise RuntimeError(f"AOT compile of {name} failed: {run.stderr.decode()[-2000:]}")
    return pickle.loads(run.stdout)


def check_resources(kernel: CompiledKernel, shared_limit: int = SHARED_MEMORY_OPTIN) -> list[str]:
    """What would stop the kernel from loading or running well: shared memory over the limit
    (static + launch-time), register spills."""
    problems = []
    shared = max(kernel.shared_bytes, kernel.launch_shared_bytes)
    if shared > shared_limit:
        problems.append(f"{kernel.name}: {shared} B shared memory > {shared_limit} B")
    if kernel.spill_bytes or kernel.stack_bytes:
        problems.append(f"{kernel.name}: {kernel.stack_bytes} B stack, {kernel.local_bytes} B local per thread")
    return problems
