# Two commands do all setup on a fresh machine with Python 3.11 to 3.13:
#   make run   - create .venv if missing, install edgegw (runtime dependencies only), run the demo
#   make test  - create/update .venv, install with test extras, lint, type-check, run the suite
PYTHON ?= python3
# Override both to run the suite on another interpreter in its own venv:
#   make pytest PYTHON=python3.13 VENV=.venv-3.13
# `make test-versions` does that for the oldest and newest supported Python (CI).
VENV   := .venv
BIN    := $(VENV)/bin
PYPROJECT := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# One stamp per install: the demo needs no test, dev or pipeline extras
# (pyspark alone is a 435 MiB download), so `make run` does not install them.
STAMP     := $(VENV)/.installed-all-$(PYPROJECT)
RUN_STAMP := $(VENV)/.installed-run-$(PYPROJECT)

.PHONY: run test test-versions test-stores lint typecheck pytest bench clean install faketime deploy-tools ceph azurite mosquitto postgresql

$(BIN)/python:
	$(PYTHON) -c 'import sys; v = sys.version_info[:2]; assert v >= (3, 11), "edgegw needs Python 3.11+"; v > (3, 13) and print("warning: edgegw is tested on Python 3.11 to 3.13, not %d.%d yet" % v)'
	@echo "creating $(VENV) with $(PYTHON) and upgrading pip in it ..."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	@echo "installing edgegw with the test, dev and pipeline extras into $(VENV) (pip install -e '.[test,dev,pipeline]'; a few minutes on a fresh venv) ..."
	$(BIN)/python -m pip install --quiet -e '.[test,dev,pipeline]'
	rm -f $(VENV)/.installed-all-*
	touch $(STAMP)

$(RUN_STAMP): $(BIN)/python pyproject.toml
	@echo "installing edgegw and its runtime dependencies into $(VENV) (pip install -e .; about a minute on a fresh venv) ..."
	$(BIN)/python -m pip install --quiet -e .
	rm -f $(VENV)/.installed-run-*
	touch $(RUN_STAMP)

install: $(STAMP)

run: $(RUN_STAMP)
	$(BIN)/edgegw demo

# lint-imports: the import contracts in pyproject.toml ([tool.importlinter]: layers,
# sans-IO format/, boto3 only in the S3 backend, private modules);
# deptry: every imported package declared, every declared one used ([tool.deptry]).
lint: $(STAMP)
	$(BIN)/ruff check edge_gateway cli tests bench fuzz
	$(BIN)/ruff format --check edge_gateway cli tests bench fuzz
	$(BIN)/lint-imports --no-cache
	$(BIN)/deptry .

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

# tests/deploy checks deploy/ with shellcheck and promtool (Debian packages
# shellcheck and prometheus); those tests fail, naming the package, without them.
# The prometheus package also installs a Prometheus server service: on a
# machine run by systemd it starts (systemctl disable --now prometheus).
deploy-tools:
	@command -v shellcheck >/dev/null && command -v promtool >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get install -y -q shellcheck prometheus || { apt-get update -q && apt-get install -y -q shellcheck prometheus; } \
	      || echo "could not install shellcheck and prometheus (promtool): tests/deploy will fail"; \
	  else \
	    echo "shellcheck or promtool missing and this is not root with apt-get: tests/deploy will fail (apt-get install shellcheck prometheus)"; \
	  fi; }

# The Azure Blob tests run against Azurite, Microsoft's storage emulator from
# npm, installed into .tools/azurite (idempotent; ~20 s the first time, then
# nothing). Without node/npm the Azure tests skip, saying why.
AZURITE := .tools/azurite/node_modules/.bin/azurite-blob
azurite: $(AZURITE)

$(AZURITE):
	@if command -v npm >/dev/null; then \
	  echo "installing Azurite (npm install --prefix .tools/azurite azurite@3) ..."; \
	  npm install --silent --no-audit --no-fund --prefix .tools/azurite azurite@3; \
	else \
	  echo "npm is not installed: the Azure Blob tests will skip (install node and npm)"; \
	fi

# tests/mqtt run the MQTT bridge against a real mosquitto (Debian package
# mosquitto), started by the tests on a loopback port. Installed here when
# missing and we are root with apt-get; otherwise those tests skip, saying why.
mosquitto:
	@command -v mosquitto >/dev/null || test -x /usr/sbin/mosquitto || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get install -y -q mosquitto || { apt-get update -q && apt-get install -y -q mosquitto; } \
	      || echo "could not install mosquitto: the MQTT tests will skip"; \
	  else \
	    echo "mosquitto is not installed and this is not root with apt-get: the MQTT tests will skip (apt-get install mosquitto)"; \
	  fi; }

# tests/metadata run the metadata server on PostgreSQL (Debian package
# postgresql; its binaries are in /usr/lib/postgresql/<version>/bin): the test
# session starts its own cluster on a loopback port (docs/metadata.md).
# Installed here when missing and we are root with apt-get; otherwise those
# tests skip, saying why. The package's own cluster does not start (policy-rc.d).
postgresql:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get install -y -q postgresql || { apt-get update -q && apt-get install -y -q postgresql; } \
	      || echo "could not install postgresql: the PostgreSQL tests will skip"; \
	  else \
	    echo "postgresql is not installed and this is not root with apt-get: the PostgreSQL tests will skip (apt-get install postgresql)"; \
	  fi; }

# The suite runs on PYTEST_WORKERS pytest-xdist processes: most tests wait on
# subprocesses, sockets and sleeps, not on the CPU. Each worker takes whole
# test modules, those with slow tests first (tests/conftest.py), and starts
# its own servers on ports of its own (edge_gateway/testing/ports.py).
# `make pytest PYTEST_WORKERS=0` runs it in one process.
PYTEST_WORKERS ?= 3
PYTEST_XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder)

pytest: $(STAMP) faketime deploy-tools azurite mosquitto postgresql
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=30 $(PYTEST_XDIST)

test: lint typecheck pytest

# The RGW tier: the bucket contract suite, the shipper/tailer/GC tests and
# `edgegw bucket check` against a real single-node Ceph RGW 16.2 on loopback
# (tests/_rgw.py; pytest marker `rgw`). Kept out of `make test`: the cluster
# takes ~15 s to start and the tier ~2 min to run (docs/operations.md).
# Installs the Debian packages when missing and we are root with apt-get.
ceph:
	@command -v radosgw >/dev/null && command -v ceph-mon >/dev/null && command -v ceph-osd >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get install -y -q radosgw ceph-mon ceph-osd || { apt-get update -q && apt-get install -y -q radosgw ceph-mon ceph-osd; } \
	      || echo "could not install radosgw, ceph-mon and ceph-osd: the RGW tests will skip"; \
	  else \
	    echo "Ceph is not installed and this is not root with apt-get: the RGW tests will skip (apt-get install radosgw ceph-mon ceph-osd)"; \
	  fi; }

test-stores: $(STAMP) ceph
	$(BIN)/python -m pytest -q -p no:cacheprovider -m rgw

# The suite on the oldest and newest supported Python (pyproject.toml's
# classifiers), each in .venv-3.X; fails when one is not installed.
test-versions:
	.ci/test-versions

bench: $(STAMP)
	$(BIN)/python bench/journal.py --quick

clean:
	rm -rf $(VENV) .venv-3.* .pytest_cache .mypy_cache .ruff_cache
