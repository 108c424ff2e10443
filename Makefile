# Every target creates what it needs: a fresh clone runs `make demo` or `make test` directly.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export MEMORY_ARCHIVE_STATE_DIR ?= $(CURDIR)/.state
export DAGSTER_HOME ?= $(MEMORY_ARCHIVE_STATE_DIR)/dagster
export HF_HUB_OFFLINE := 1

.PHONY: install demo test lint dev bench clean stop-db

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m memory_lib.demo

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check memory_lib memory_assets tests bench

stop-db: $(STAMP)
	$(PY) -m memory_lib.cli db stop

clean:
	rm -rf .state $(VENV)
