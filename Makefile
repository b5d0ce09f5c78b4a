# Set-up and checks. `make demo` runs the main job on a random-weight model;
# `make test` runs the test suite. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# jax's CUDA plugin (no CUDA libraries) for the deviceless GPU compiles of the tests and
# rwkv7-gpu-compile; kept outside the environment so plain runs never see it.
CUDA_PLUGIN := $(VENV)/cuda-plugin

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch (a wheel on CI machines' disk); a bare `torch` would pull CUDA.
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rwkv7-generate --random-model tiny-world --input rwkv7_apps/data/example_prompts.jsonl \
		--output /tmp/rwkv7_demo_out.jsonl --max-tokens 32 --metrics /tmp/rwkv7_demo_metrics.json \
		--plot /tmp/rwkv7_demo_run.png
	@echo "outputs: /tmp/rwkv7_demo_out.jsonl  metrics: /tmp/rwkv7_demo_metrics.json  plot: /tmp/rwkv7_demo_run.png"

$(CUDA_PLUGIN)/.installed: $(STAMP)
	v=$$($(BIN)/python -c 'import jax; print(jax.__version__)') && \
	$(BIN)/pip install -q --no-deps --target $(CUDA_PLUGIN) "jax-cuda12-plugin==$$v" "jax-cuda12-pjrt==$$v"
	touch $@

test: $(STAMP) $(CUDA_PLUGIN)/.installed
	JAX_PLATFORMS=cpu RWKV7_CUDA_PLUGIN_DIR=$(abspath $(CUDA_PLUGIN)) $(BIN)/python -m pytest -n 2 -q tests

bench: $(STAMP)
	PYTHONPATH=. $(BIN)/python benchmarks/cpu_model_bench.py

clean:
	rm -rf $(VENV) .pytest_cache
