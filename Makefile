# The commands of the README: `make demo`, `make check` (the fast tier) and `make test` (everything).
# All set everything up first.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=
# Two pytest-xdist workers: the tests that start vLLM engines run on one, in file order
# (tests/conftest.py groups them), everything else on the other. PYTEST_WORKERS=0 runs serially.
PYTEST_WORKERS ?= 2

.PHONY: setup demo check test proto bench sims clean

setup: $(STAMP)

$(STAMP): pyproject.toml deploy/install_engine.sh deploy/install_system.sh
	@command -v $(PY) >/dev/null || { echo "error: $(PY) not found (GenTorrent needs Python 3.11)"; exit 1; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	bash deploy/install_engine.sh $(BIN)/python
	bash deploy/install_system.sh
	@touch $(STAMP)

demo: setup
	$(BIN)/python -m devnet.demo

# pytest exits 5 when it collects no test: that is a failure here, never a green run.
# The fast tier: no vLLM engine, no other process, no server, fewer schedules (tests/conftest.py).
check: setup
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --tier check $(PYTEST_ARGS)

test: setup
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

proto: setup
	$(BIN)/python -m gentorrent.wire.generate

# Regenerate every simulator figure into results/sims/ (CSV, markdown, PNG).
sims: setup
	$(BIN)/python -m sims.anonymity
	$(BIN)/python -m sims.confidentiality
	$(BIN)/python -m sims.churn
	$(BIN)/python -m sims.linkability

clean:
	rm -rf $(VENV) build *.egg-info
