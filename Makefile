# Two commands do all the set-up on a fresh machine (see README.md):
#   make demo   - a local swarm training the tiny default model on the bundled corpus, with a progress display
#   make test   - lint and the whole test suite (CI runs exactly this)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/skippipe demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -ra

bench: $(STAMP)
	$(PY) benchmarks/planner.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
