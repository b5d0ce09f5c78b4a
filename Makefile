# Set-up and checks. `make demo` runs the main job on a random-weight model;
# `make test` runs the test suite. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

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

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q tests

bench: $(STAMP)
	PYTHONPATH=. $(BIN)/python benchmarks/cpu_model_bench.py

clean:
	rm -rf $(VENV) .pytest_cache
