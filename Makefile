# Two commands do all the set-up on a fresh machine (see README.md):
#   make demo   - a local swarm training the tiny default model on the bundled corpus, with a progress display
#   make test   - lint and the whole test suite (CI runs exactly this)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean system-packages

$(STAMP): pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/skippipe demo

# Debian packages some tests need (Chromium renders the monitor page); installed only when running as root,
# elsewhere those tests skip and say why
system-packages:
	@if [ "$$(id -u)" = 0 ] && ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for the monitor page test"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium >/dev/null) || echo "could not install chromium: the page test will skip"; \
	fi
	@if [ "$$(id -u)" = 0 ] && ! command -v iptables >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's iptables for the NAT tests (routers in network namespaces)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			iptables >/dev/null) || echo "could not install iptables: the NAT tests will skip"; \
	fi

# The tests of one part or a few processes run three at a time on two cores (much of their time is waiting:
# deadlines, retries, processes starting; 4.2 min against 5.6 at two). The end-to-end swarms (marked slow) run two
# at a time: each waits on its own deadlines (heartbeats, dial timeouts, iteration budgets) rather than on a
# wall-clock figure, so sharing the cores slows them (churn 120 s -> 190 s) but does not change what they detect;
# they stay at two, where their deadlines were tuned; SLOW_TEST_WORKERS=1 runs them one at a time
# (--dist loadfile: the tests of one file run on one worker, so that a module-scoped swarm is shared, not started
# again on the other worker, where a test that reads what an earlier one checked would find nothing and skip).
TEST_WORKERS ?= 3
SLOW_TEST_WORKERS ?= 2

test: $(STAMP) system-packages
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -ra --durations=15 -m "not slow" -n $(TEST_WORKERS); rest=$$?; \
		$(PY) -m pytest -q -ra --durations=25 -m slow -n $(SLOW_TEST_WORKERS) --dist loadfile; slow=$$?; \
		exit $$(( rest || slow ))

bench: $(STAMP)
	$(PY) benchmarks/planner.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
