# Two commands do all setup on a fresh machine with Python 3.11+:
#   make run   - create .venv if missing, install, run the embedded demo
#   make test  - create/update .venv, install with test extras, lint, type-check, run the suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test lint typecheck pytest bench clean install faketime

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "edgegw needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test,dev,pipeline]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/edgegw demo

lint: $(STAMP)
	$(BIN)/ruff check edge_gateway cli tests bench fuzz
	$(BIN)/ruff format --check edge_gateway cli tests bench fuzz

typecheck: $(STAMP)
	$(BIN)/mypy --strict edge_gateway

# The clock tests (tests/system/test_clocks.py) run gateways under libfaketime
# (Debian package faketime). Installed here when missing and we are root on a
# Debian-like system; otherwise those tests skip, saying why.
faketime:
	@command -v faketime >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get install -y -q faketime || { apt-get update -q && apt-get install -y -q faketime; } \
	      || echo "could not install faketime: the clock tests will skip"; \
	  else \
	    echo "faketime is not installed and this is not root with apt-get: the clock tests will skip"; \
	  fi; }

pytest: $(STAMP) faketime
	$(BIN)/python -m pytest -q -p no:cacheprovider

test: lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python bench/journal.py --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
