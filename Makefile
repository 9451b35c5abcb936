# Two commands do all the set-up: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# pytest-xdist workers; each test has its own namespace, schema and key prefix.
WORKERS ?= 2

.PHONY: run test unit integration crash chaos bench revert-checks install compose-check clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/signoff demo

# The broker-restart test restarts the shared RabbitMQ, so it runs alone, last.
test: $(STAMP)
	$(BIN)/python -m pytest -n $(WORKERS) -q --durations=10 -m "not broker_restart" tests
	$(BIN)/python -m pytest -q -m broker_restart tests

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest -n $(WORKERS) -q tests/integration

crash: $(STAMP)
	$(BIN)/python -m pytest -n $(WORKERS) -q -m "not broker_restart" tests/crash
	$(BIN)/python -m pytest -q -m broker_restart tests/crash

chaos: $(STAMP)
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS)

revert-checks: $(STAMP)
	$(BIN)/python -m tests.revert_checks

bench: $(STAMP)
	$(BIN)/python -m tests.bench $(BENCH_ARGS)

compose-check: $(STAMP)
	$(BIN)/python -c "import yaml,sys; d=yaml.safe_load(open('docker-compose.yml')); print('docker-compose.yml parses:', ', '.join(sorted(d['services'])))"

clean:
	rm -rf $(VENV) data .pytest_cache
