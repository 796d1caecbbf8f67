# Two commands on a fresh machine:  `make demo`  and  `make test`.
# Set-up is a stamp file: re-running is instant while pyproject.toml is unchanged.
VENV    ?= .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-stamp
# torch/torchvision are pinned to the wheels this project is tested with (CPU works with the CUDA build).
TORCH   ?= torch==2.14.1 torchvision==0.29.1

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e ".[dev,textworld]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/seed-vl demo

test: setup
	$(BIN)/python -m pytest -q -m "not slow"

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(BIN)/python benchmarks/bench_scoring.py
	$(BIN)/python benchmarks/bench_envs.py

clean:
	rm -rf $(VENV) .cache runs
