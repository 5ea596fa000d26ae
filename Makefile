# agentstate: `make demo` (the main job) and `make test` (what CI runs).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install services lint typecheck unit test docs reference demo bench lock clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Each target checks (and on this machine may start) only the services it uses: the app's
# own AGENTSTATE_* URLs for the demo, AGENTSTATE_TEST_* for the suite, AGENTSTATE_BENCH_*
# for the benchmarks.
services:
	@scripts/ensure-services.sh test

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest -q tests/unit

# Two test processes (pytest-xdist; TEST_PROCESSES=1 for one), each a whole module at a
# time, the slowest modules first (tests/scheduling.py), each on a database, Redis indexes
# and a RabbitMQ vhost of its own (tests/support.py).
TEST_PROCESSES ?= 2

test: install services lint typecheck docs
	$(BIN)/pytest -q $(if $(filter-out 1,$(TEST_PROCESSES)),-n $(TEST_PROCESSES) --dist loadfile)

# The docs site, built strictly into site/: a broken link, a missing page or a reference
# page the code can no longer write fails the build. The reference pages (CLI, settings,
# errors, client, FSM, HTTP routes) are written from the code by docs/hooks/reference.py
# (`make reference`) and committed.
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Rewrites the committed reference pages from the code (tests/unit/test_docs.py fails while
# they disagree).
reference: $(DOCS_STAMP)
	$(BIN)/python docs/hooks/reference.py

demo: install
	@scripts/ensure-services.sh app
	$(BIN)/agentstate demo

# `make bench ROWS=throughput,latency` runs some row groups only, `QUICK=1` at small sizes
# (`python -m bench --help` lists the groups).
bench: install
	@scripts/ensure-services.sh bench
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[bench]'
	$(BIN)/python -m bench $(if $(ROWS),--rows $(ROWS)) $(if $(QUICK),--quick)

# requirements.lock (the Docker image installs exactly it): every dependency of
# pyproject.toml (with the server extra: the image also runs `agentstate serve`; and the
# otel extra, so AGENTSTATE_OTEL=true works in it) and the
# build backend, pinned, with the hashes of PyPI's files.
lock:
	$(PYTHON) -m venv $(VENV)/pip-tools
	$(VENV)/pip-tools/bin/pip install --quiet --disable-pip-version-check pip-tools==7.6.2
	env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null \
		CUSTOM_COMPILE_COMMAND="make lock" $(VENV)/pip-tools/bin/pip-compile --quiet \
		--generate-hashes --allow-unsafe --all-build-deps --strip-extras --no-emit-index-url \
		--extra server --extra otel \
		--output-file requirements.lock pyproject.toml

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache agentstate.db* site
