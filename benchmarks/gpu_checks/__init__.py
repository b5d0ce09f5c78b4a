"""The sections of benchmarks/gpu_check.py, one module each, and its runner (``runner.main``).

Needs jax (+ its CUDA plugin), flax and numpy from a source checkout; torch and triton are
optional. DIR/gpu_check.json and DIR/gpu_check.md are rewritten (atomically) after every
section and every item of a long one, so a run killed at any moment keeps what it measured.
Each section records its status (ok, failed or skipped, with a reason) and seconds.

A cold run must end within TOTAL_BUDGET_S (``schedule``). Each decode / models / quantized /
prefill item starts only if its recorded deviceless compile seconds (``schedule``'s tables,
from benchmarks/results/), times the slowest measured/recorded ratio so far, fit what is left;
what does not fit is listed as skipped with the reason, and a rerun with --cache-dir compiles
nothing and reaches it. The expected seconds of each section are in
docs/kernels-and-gpu-free-compile.md.

Sections in order:

1. parity (``parity``, capped at PARITY_BUDGET_S): every Pallas kernel against its plain-jnp
   reference on random inputs (C=192, H=3, odd B; the chunked varlen wkv kernel on lengths
   0..300), sparse channel-mix exactness, the fused decode path's self-check, and whole random
   float32 models (tiny and ODD) with kernels "xla", "pallas" and "pallas-fused" on the device
   against kernels="xla" on the CPU.
2. torch_parity (``torch_parity``, in a child process started before section 1 and awaited
   at most TORCH_WAIT_S after it): the torch reference with its Triton kernels against plain
   torch and the JAX model; skipped, with the reason, without torch or a CUDA device for it.
3. roofline (``roofline``): copy bandwidth and bf16 matmul rate.
4. mosaic (benchmarks/gpu_check_mosaic.py): the self-check of kernels="mosaic", then its decode
   rows beside pallas-fused.
5. decode (``decode``): the 1.5b shape in bf16 at DECODE_BATCHES for "pallas-fused", "pallas"
   and "xla" (tok/s, step ms, roofline fractions, launches per step) and the engine's whole
   decode step; the expensive XLA compiles come last.
6. state_dtype (``decode``): the 1.5b pallas-fused B = 256 row with a bfloat16 wkv state.
7. deviceless (``deviceless``): a tiny forward compiled for the H200 description, loaded on
   this GPU, equal to the same forward compiled here.
8. quantized (``quantized``, capped at QUANTIZED_BUDGET_S): int4 / int8 / fp8 kernel parity,
   then decode rows.
9. prefill (``prefill``): 1.5b bf16 prefill at PREFILL_ITEMS, cheapest compile first, against
   the roofline that binds.
10. models (``models``): 2.9b decode, prefill T = PREFILL_T, the other decode buckets.
11. kernels (``kernel_times``, capped at KERNEL_BUDGET_S): each kernel against the XLA op it
    replaces.
12. serving, http_serving (``serving``), data_parallel (``data_parallel``, 2 GPUs or more).

--smoke runs every section on the CPU with tiny shapes and interpret-mode kernels and no time
budget (a CI test); the deviceless section then compiles and serializes but cannot load.
"""
