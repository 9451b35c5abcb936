# Two commands do all the set-up: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# pytest-xdist workers; each test has its own namespace, schema and key prefix. Three on
# the developers' two cores: the integration tests wait on services and timers much of
# the time (`make test` took 15:08 with two, 12:14 with three).
WORKERS ?= 3

.PHONY: docs test-long cluster-test cluster-smoke bench-backlog bench-cluster services run test lint contract unit integration crash chaos bench revert-checks install compose-check clean mutation mutation-smoke fuzz

$(STAMP): pyproject.toml sdk/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	# The slim SDK for agents (sdk/, its own package: httpx and pydantic only), for its tests.
	$(BIN)/pip install --quiet --no-deps -e sdk
	# The frameworks its adapters are tested with (its extras, pinned there), beside the server.
	$(BIN)/pip install --quiet -e 'sdk[langchain,openai-agents]'
	@touch $(STAMP)

install: $(STAMP)

# Start whichever local service is down (and RabbitMQ's management and Prometheus plugins).
services:
	@bash deploy/local/services_up.sh

run: $(STAMP) services
	$(BIN)/signoff setup
	$(BIN)/signoff demo

# Style, types and formatting of the services and shared code; the import
# contracts are a unit test (tests/unit/test_import_contracts.py).
lint: $(STAMP)
	$(BIN)/ruff check services shared signoff sdk examples
	$(BIN)/ruff format --check services shared signoff sdk examples
	$(BIN)/mypy

# The channel adapters' contract (AsyncAPI) and the gateway's HTTP API (OpenAPI 3.1),
# generated from the code; a unit test fails while a committed one differs.
# The docs site's reference pages are generated from the settings classes and these two
# documents (docs/generate.py); a unit test fails while a committed page differs.
contract: $(STAMP)
	$(BIN)/python -m shared.contract > docs/asyncapi.yaml
	$(BIN)/python -m services.gateway.app > docs/openapi.json
	$(BIN)/python docs/generate.py

# The docs site (MkDocs Material, mkdocs.yml) into site/; --strict: a broken link or anchor
# fails the build. `make test` builds it too. `$(BIN)/mkdocs serve` previews it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# What a developer waits for: style and types, the docs site, then every test that takes
# under a minute, in parallel, on PostgreSQL, and on SQLite too where the stores differ (the crash
# tests and the store contract; tests/store_twins.py), the property tests with a quarter of their examples (tests/conftest.py;
# the mutation smoke test of `make test-long` runs them in full). The long tier is `make test-long`; CI (.ci/run) runs both,
# and the cluster.
test: $(STAMP) lint docs services
	@bash tests/install_prometheus.sh
	@bash tests/install_chromium.sh
	$(BIN)/python -m pytest -n $(WORKERS) -q --durations=10 --hypothesis-profile=quick \
	  -m "not slow and not store_twin and not broker_restart and not database_outage and not cluster" tests

# The long tier: the mutation smoke test (mutmut's first step runs every unit test), the
# tests marked `slow(reason=...)` and the SQLite runs `make test` leaves out, in parallel, then the broker-restart and database-outage
# tests alone, last, since they stop shared services.
test-long: $(STAMP) mutation-smoke services
	@bash tests/install_prometheus.sh
	@bash tests/install_chromium.sh
	$(BIN)/python -m pytest -n $(WORKERS) -q --durations=10 -m "(slow or store_twin) and not broker_restart and not database_outage and not cluster" tests
	$(BIN)/python -m pytest -q -m "broker_restart or database_outage" tests

# A three-node RabbitMQ cluster and a PostgreSQL primary + synchronous standby on
# loopback (deploy/local/cluster_up.sh; its own ports, beside the shared services), then the
# tests that kill or cut off their nodes, one at a time (one to three minutes each), then the
# cluster stopped again, whatever the tests said (needs root: it runs the nodes as their users).
cluster-test: $(STAMP) services
	@trap 'bash deploy/local/cluster_down.sh' EXIT; trap 'exit 130' INT TERM; \
	  bash deploy/local/cluster_up.sh && $(BIN)/python -m pytest -q -s -m cluster tests/cluster $(CLUSTER_ARGS)

# CI's share of the cluster tier (about 2 minutes): the PostgreSQL primary lost and its
# synchronous standby promoted under load. `make cluster-test` runs all four (about 7
# minutes): before a release, and after a change to failover, reconnection or leadership.
cluster-smoke:
	@$(MAKE) --no-print-directory cluster-test CLUSTER_ARGS="-k synchronous_standby_promoted"

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest -n $(WORKERS) -q tests/integration

crash: $(STAMP)
	$(BIN)/python -m pytest -n $(WORKERS) -q -m "not broker_restart and not database_outage" tests/crash
	$(BIN)/python -m pytest -q -m "broker_restart or database_outage" tests/crash

chaos: $(STAMP)
	$(BIN)/python -m tests.chaos $(CHAOS_ARGS)

revert-checks: $(STAMP)
	$(BIN)/python -m tests.revert_checks

# Fuzz every consumer (tests/integration/test_fuzz.py): SIGNOFF_FUZZ_MESSAGES random and
# mutated messages per store, SQLite then PostgreSQL, beside real sessions, then the
# minimal cases of the bugs it found. `make test` runs the same test with 400 messages.
# Smaller: `make fuzz SIGNOFF_FUZZ_MESSAGES=5000`.
SIGNOFF_FUZZ_MESSAGES ?= 100000
fuzz: $(STAMP)
	SIGNOFF_FUZZ_MESSAGES=$(SIGNOFF_FUZZ_MESSAGES) $(BIN)/python -m pytest -q -s -o timeout=0 -rxX tests/integration/test_fuzz.py

bench: $(STAMP)
	$(BIN)/python -m tests.bench $(BENCH_ARGS)
	# The intake's level: a program's file → approve → claim → report through the gateway.
	$(BIN)/python -m tests.bench.intake $(BENCH_INTAKE_ARGS)
	# The MCP proxy's level: its added latency on an allowed call, and `ask` calls approved at once.
	$(BIN)/python -m tests.bench.mcp_proxy $(BENCH_MCP_ARGS)

# What a backlog of requests waiting for a person costs PostgreSQL: 0, 1,000,
# 5,000 and 20,000 pending, built over the bus first (tests/bench/backlog.py).
bench-backlog: $(STAMP)
	$(BIN)/python -m tests.bench.backlog $(BENCH_ARGS)

# The same bench on the cluster of deploy/local/cluster_up.sh (three RabbitMQ nodes, quorum
# queues replicated to all three; a PostgreSQL primary with a synchronous standby), started if
# down and left up (cluster_down.sh stops it): beside `make bench`, the cost of replication.
bench-cluster: $(STAMP) services
	bash deploy/local/cluster_up.sh
	SIGNOFF_TEST_RABBITMQ_URL=amqp://guest:guest@127.0.0.1:5681,127.0.0.1:5682,127.0.0.1:5683/ \
	  SIGNOFF_TEST_RABBITMQ_ADMIN_URL=http://guest:guest@127.0.0.1:15681/ \
	  SIGNOFF_TEST_POSTGRES_URL='postgresql://postgres@127.0.0.1:5442,127.0.0.1:5443/test?target_session_attrs=read-write' \
	  $(BIN)/python -m tests.bench $(BENCH_ARGS)

compose-check: $(STAMP)
	$(BIN)/python -c "import yaml,sys; d=yaml.safe_load(open('docker-compose.yml')); print('docker-compose.yml parses:', ', '.join(sorted(d['services'])))"

# Mutation testing of the pure rules with tests/unit alone (`make test-long` runs only
# `mutation-smoke`, below); the scores: docs/testing.md, "Mutation scores".
# mutmut mutates a copy in mutants/ (the working tree is never touched), then this
# prints one score per unit: killed (or timed out) / mutants made. A unit is a prefix
# of mutmut's mutant names (claims.py: its pure functions; the Claims class needs a database;
# handlers.py: against the in-memory store, tests/unit/test_ledger_handlers.py).
# To add a module: list its file under [tool.mutmut] only_mutate in pyproject.toml and
# its prefix here.
MUTATION_UNITS ?= services.tool_executor.claims.x_decide_ services.tool_executor.claims.x_fresh_claim_ \
	services.tool_executor.claims.x_retaken_claim_ services.tool_executor.claims.x_renewed_lease_ \
	shared.rule_types. \
	services.tool_executor.claims.x_lost_call_ shared.catalogue. \
	services.model_step.tool_call_ids. services.model_step.transcript_guard. \
	services.approval_ledger.domain. shared.redaction. services.approval_ledger.handlers. \
	services.approval_ledger.decision_rules. $(INBOX_UNITS)
# The inbox's pure page rules (its routes need a gateway: the integration and browser tests).
INBOX_UNITS = $(foreach f,shown_card edit_fields edited_arguments duration sorted_for safe_next turn_said \
	_identifier _shown_entry,services.gateway.inbox.x_$(f)_)

mutation: $(STAMP)
	rm -rf mutants && mkdir mutants
	$(BIN)/mutmut run --max-children $(WORKERS) $(foreach unit,$(MUTATION_UNITS),'$(unit)*') >mutants/run.log 2>&1 \
		|| { tail -n 40 mutants/run.log; exit 1; }
	@$(BIN)/mutmut results --all true | awk -v units="$(MUTATION_UNITS)" ' \
		BEGIN { n = split(units, unit, " ") } \
		{ name = $$1; sub(/:$$/, "", name); status = $$0; sub(/^[^:]*: /, "", status); \
		  for (i = 1; i <= n; i++) if (index(name, unit[i]) == 1) { \
		    total[i]++; if (status == "killed" || status == "timeout") killed[i]++; \
		    else left[i] = left[i] "    " status ": " name "\n" } } \
		END { for (i = 1; i <= n; i++) { \
		    printf "%-58s %4d/%-4d %5.1f %%\n", unit[i] "*", killed[i], total[i], total[i] ? 100 * killed[i] / total[i] : 0; \
		    printf "%s", left[i] } }'
	@echo "survivors: $(BIN)/mutmut show NAME (run from this directory); log: mutants/run.log"

# Part of `make test-long`: mutmut on one small unit, in a copy of the files a fresh clone
# has (tracked and untracked, not ignored), so what the unit tests read but mutmut's
# copy lacks (`also_copy` in pyproject.toml) fails here, as docker-compose.yml once
# did, rather than in a later `make mutation`. mutmut's first step runs every unit
# test, so that is most of its minute or two. This directory's mutants/ is untouched.
MUTATION_SMOKE_UNIT ?= services.model_step.tool_call_ids.x_suffixed
mutation-smoke: $(STAMP)
	@copy=$$(mktemp -d) && trap 'rm -rf "$$copy"' EXIT && \
	git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$$copy" && \
	cd "$$copy" && { $(abspath $(BIN))/mutmut run --max-children 1 '$(MUTATION_SMOKE_UNIT)*' >run.log 2>&1 \
		|| { tail -n 40 run.log; echo "mutation-smoke: mutmut stopped before scoring $(MUTATION_SMOKE_UNIT)"; exit 1; }; } && \
	$(abspath $(BIN))/mutmut results --all true | awk -v unit="$(MUTATION_SMOKE_UNIT)" ' \
		index($$1, unit) == 1 { total++; if ($$NF == "killed" || $$NF == "timeout") killed++; else if ($$NF != "survived") unscored++ } \
		END { if (total == 0 || unscored > 0) { printf "mutation-smoke: no score for %s (%d mutants, %d unscored)\n", unit, total, unscored; exit 1 } \
		      printf "mutation-smoke: %s* %d/%d killed\n", unit, killed, total }'

clean:
	rm -rf $(VENV) data .pytest_cache
