# Set-up and checks. `make demo` runs the main job on a random-weight model; `make test` runs
# the whole test suite on the pinned stack; `make ci` runs what CI runs (every stack, see below:
# the whole suite on the pinned stack, and on the GPU machine's stack the tests whose behaviour
# depends on the stack, less the slow sweeps marked `single_stack`).
# Each stack lives in its own virtual environment, created on first use.
#
#   stack   Python  jax             CUDA compile plugin  torch / triton           venv
#   pinned  3.11    0.10.2          cuda12               2.13.0 CPU / 3.9         .venv
#   gpu     3.12    0.11.2          cuda13               2.11.0+cu130 / 3.6       .venv-gpu   (the lent GPU machine's)
#   newest  3.12    newest release  cuda13               none                     .venv-newest
PY ?= python3
PY312 ?= $(firstword $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.12*/bin/python3) python3.12)
JAX_PINNED := 0.10.2
JAX_GPU := 0.11.2
NVCC := nvidia-cuda-nvcc==13.5.37
# jax's CUDA plugin (no CUDA libraries) and a ptxas, for the deviceless GPU compiles of the
# tests and rwkv7-gpu-compile; kept outside each environment (pip --target) so that plain
# runs never see them.
PLUGIN = $(1)/cuda-plugin
PYTEST = -m pytest -n 2 --dist worksteal -q --durations=25
# What the stack changes: jax and Pallas (model, kernels, deviceless compiles), torch/Triton,
# the engines under the scheduler, Python 3.12's protocol checks on replicas, the GPU script.
GPU_STACK_TESTS := tests/rwkv_jax tests/pallas_kernels tests/cpu_kernels tests/rwkv_torch_ref tests/integration \
	tests/rwkv7_apps/test_replica_capabilities.py tests/rwkv7_apps/test_data_parallel_cli.py \
	tests/rwkv7_apps/test_gpu_compile.py tests/benchmarks/test_gpu_check_smoke.py \
	tests/benchmarks/test_decode_mosaic_report_smoke.py
# Tests share one JAX compilation cache per stack (in-process compiles and every CLI
# subprocess): the same tiny-model executables are compiled by many tests.
TEST_ENV = JAX_PLATFORMS=cpu RWKV7_CUDA_PLUGIN_DIR=$(abspath $(call PLUGIN,$(1))) \
	JAX_COMPILATION_CACHE_DIR=$(abspath $(1)/jax-cache) JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
	JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
WHEELHOUSE := build/wheelhouse

.PHONY: demo lint test test-gpu-stack smoke-newest test-offline wheelhouse ci bench clean

# -- pinned stack -------------------------------------------------------------------------
.venv/.installed: pyproject.toml
	test -x .venv/bin/python || $(PY) -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	# CPU build of torch (a wheel on CI machines' disk); a bare `torch` would pull CUDA.
	.venv/bin/pip install -q "torch==2.13.0" "jax==$(JAX_PINNED)" "jaxlib==$(JAX_PINNED)"
	.venv/bin/pip install -q -e ".[test]"
	touch $@

.venv/cuda-plugin/.installed: .venv/.installed
	.venv/bin/pip install -q --no-deps --target .venv/cuda-plugin \
		"jax-cuda12-plugin==$(JAX_PINNED)" "jax-cuda12-pjrt==$(JAX_PINNED)" "$(NVCC)"
	touch $@

demo: .venv/.installed
	.venv/bin/rwkv7-generate --random-model tiny-world --input rwkv7_apps/data/example_prompts.jsonl \
		--output /tmp/rwkv7_demo_out.jsonl --max-tokens 32 --metrics /tmp/rwkv7_demo_metrics.json \
		--plot /tmp/rwkv7_demo_run.png
	@echo "outputs: /tmp/rwkv7_demo_out.jsonl  metrics: /tmp/rwkv7_demo_metrics.json  plot: /tmp/rwkv7_demo_run.png"

# ruff (lint and import order) over the tree, mypy over the packages; settings in pyproject.toml.
lint: .venv/.installed
	.venv/bin/ruff check .
	.venv/bin/mypy

test: .venv/.installed .venv/cuda-plugin/.installed
	$(call TEST_ENV,.venv) .venv/bin/python $(PYTEST) tests

# -- the GPU machine's stack --------------------------------------------------------------
.venv-gpu/.installed: pyproject.toml
	test -x .venv-gpu/bin/python || $(PY312) -m venv .venv-gpu
	.venv-gpu/bin/pip install -q --upgrade pip
	.venv-gpu/bin/pip install -q "jax==$(JAX_GPU)" "jaxlib==$(JAX_GPU)" "numpy==2.5.2" "torch==2.11.0" "triton==3.6.0"
	.venv-gpu/bin/pip install -q -e ".[test]"
	.venv-gpu/bin/pip install -q --no-deps --target .venv-gpu/cuda-plugin \
		"jax-cuda13-plugin==$(JAX_GPU)" "jax-cuda13-pjrt==$(JAX_GPU)" "$(NVCC)"
	touch $@

test-gpu-stack: .venv-gpu/.installed
	$(call TEST_ENV,.venv-gpu) .venv-gpu/bin/python $(PYTEST) -m "not single_stack" $(GPU_STACK_TESTS)

# -- newest jax on Python 3.12: install, demo, the deviceless 1.5b decode compile -----------
.venv-newest/.installed: pyproject.toml
	test -x .venv-newest/bin/python || $(PY312) -m venv .venv-newest
	.venv-newest/bin/pip install -q --upgrade pip
	.venv-newest/bin/pip install -q --upgrade -e .
	v=$$(.venv-newest/bin/python -c 'import jax; print(jax.__version__)') && \
	.venv-newest/bin/pip install -q --no-deps --target .venv-newest/cuda-plugin \
		"jax-cuda13-plugin==$$v" "jax-cuda13-pjrt==$$v" "$(NVCC)"
	touch $@

smoke-newest: .venv-newest/.installed
	mkdir -p build
	.venv-newest/bin/python -c 'import jax, numpy; print("newest stack: jax", jax.__version__, "numpy", numpy.__version__)'
	.venv-newest/bin/rwkv7-generate --random-model tiny-world --input rwkv7_apps/data/example_prompts.jsonl \
		--output build/newest_demo_out.jsonl --max-tokens 8
	$(call TEST_ENV,.venv-newest) .venv-newest/bin/rwkv7-gpu-compile --shape 1.5b --dtype bfloat16 \
		--kernels pallas,pallas-fused --buckets 1x1 --pallas-only-ptxas --strict --json build/newest_gpu_compile.json

# -- offline install: a wheelhouse for Python 3.12, installed with --no-index ---------------
wheelhouse: .venv/.installed
	rm -rf $(WHEELHOUSE)
	.venv/bin/python tools/wheelhouse.py --python-version $(or $(WHEELHOUSE_PY),3.12) --out $(WHEELHOUSE)

# A fresh venv stands in for the GPU machine's image: it gets from the index only what the
# wheelhouse left to the image (jax, numpy, flax, ...), then everything else --no-index.
test-offline: wheelhouse
	rm -rf build/offline-venv
	$(PY312) -m venv build/offline-venv
	sed -n 's/^# from the image: //p' $(WHEELHOUSE)/MANIFEST.txt > build/offline-image.txt
	build/offline-venv/bin/pip install -q --no-deps -r build/offline-image.txt
	build/offline-venv/bin/pip install -q --no-index --find-links $(WHEELHOUSE) rwkv7-engine
	cd build && offline-venv/bin/rwkv7-generate --random-model tiny-world \
		--input ../rwkv7_apps/data/example_prompts.jsonl --output offline_demo_out.jsonl --max-tokens 8
	cd build && offline-venv/bin/python -c 'import rwkv_jax, scheduler, rwkv7_apps; print("offline install ok:", rwkv_jax.__file__)'

# -- everything CI runs, each stage timed -----------------------------------------------------
CI_STAGES := lint smoke-newest test-offline test-gpu-stack test
ci:
	@for stage in $(CI_STAGES); do start=$$(date +%s); $(MAKE) --no-print-directory $$stage || exit 1; \
		echo "== make $$stage: $$(( $$(date +%s) - start )) s"; done

bench: .venv/.installed
	PYTHONPATH=. .venv/bin/python benchmarks/cpu_model_bench.py

clean:
	rm -rf .venv .venv-gpu .venv-newest build .pytest_cache
