# pgpoll — set-up and everyday commands. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The test matrix: the full suite runs on the first version, the compatibility tests on all.
PGPOLL_TEST_PG ?= 15,16,17,18
export PGPOLL_TEST_PG

.PHONY: help prereqs install test demo bench dist airflow-venv docs vendor-mermaid vendor-uplot clean

help:
	@echo "make demo   - set up .venv, start a throwaway PostgreSQL, fill a slot and show it"
	@echo "make test   - set up .venv and run the whole test suite"
	@echo "make bench  - run the benchmarks and print their figures"
	@echo "make docs   - regenerate the reference pages from the code and build the documentation site into site/"
	@echo "make dist   - build dist/: the wheel, pgpoll.zip for spark-submit --py-files, ingest.py, materialize.py, snapshot.py, housekeeping.py, log4j2.properties"
	@echo "make airflow-venv - Apache Airflow 3, its Spark provider and pgpoll (no dependencies) in .venv-airflow, for the DAG test"
	@echo "make clean  - remove .venv and build leftovers"

prereqs:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null || { \
	  echo "pgpoll needs Python 3.11 or newer as '$(PYTHON)'. Install it (Debian: apt-get install python3) or run: make PYTHON=/path/to/python3.11 ..."; exit 2; }
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { \
	  echo "Python's venv module is missing. Install it (Debian: apt-get install python3-venv)."; exit 2; }
	@command -v java >/dev/null 2>&1 || { \
	  echo "Spark needs Java 17 or newer and no 'java' is on PATH. Install it (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME."; exit 2; }
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); [ -n "$$v" ] && [ "$$v" -ge 17 ] || { \
	  echo "Spark needs Java 17 or newer; 'java -version' reports $$v. Install openjdk-17 (or newer) and put it first on PATH."; exit 2; }

$(VENV)/.installed: pyproject.toml | prereqs
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,matrix,docs]'
	@touch $@

install: prereqs $(VENV)/.installed
	@$(PY) -m pgpoll.testing.prereqs

# The Airflow DAG test needs Apache Airflow in its own venv; `make test AIRFLOW=0` leaves it out
# (it then skips, saying why). If PyPI cannot provide Airflow, the test skips and says so too.
AIRFLOW ?= 1
test: install
	@if [ "$(AIRFLOW)" = 1 ]; then $(MAKE) --no-print-directory airflow-venv || \
	  echo "note: could not build $(AIRFLOW_VENV) (Apache Airflow from PyPI): the Airflow DAG tests will skip"; fi
	PGPOLL_TEST_AIRFLOW=$$([ "$(AIRFLOW)" = 1 ] && [ -f $(AIRFLOW_VENV)/.pgpoll-installed ] && echo 1) $(PY) -m pytest

# The demo needs pgpoll itself and DuckDB (to read back what it wrote), not the test-only PostgreSQL
# wheels of the `matrix` extra: it runs on the system's PostgreSQL (Debian: apt-get install postgresql).
# After `make test` the same .venv already holds all of it (pip then installs nothing).
$(VENV)/.demo-installed: pyproject.toml | prereqs
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e . "duckdb>=1.0"
	@touch $@

demo: prereqs $(VENV)/.demo-installed
	@$(PY) -m pgpoll.testing.prereqs
	$(PY) -m pgpoll.testing.demo

bench: install
	$(PY) -m pgpoll.testing.prereqs
	$(PY) bench/run_all.py
	cp bench/results/report.md docs/snippets/bench-report.md  # the Performance page includes it: commit it

# The documentation site (docs/, mkdocs.yml): the reference pages generated from the code (committed; the tests
# fail when they are stale), then a strict build into site/. Needs nothing from the network.
docs: $(VENV)/.installed
	$(PY) docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site
	@echo "built site/: open site/index.html, or serve it: $(PY) -m http.server -d site"

# Mermaid for the site's diagrams is vendored from npm (committed, so the build and the site need no network).
# Stay on major 11: Material's integration is written for it. make vendor-mermaid MERMAID_VERSION=11.x.y
MERMAID_VERSION ?= 11.17.2
MERMAID_DIR := docs/assets/vendor/mermaid
vendor-mermaid:
	@command -v npm >/dev/null 2>&1 || { echo "vendor-mermaid needs npm (Debian: apt-get install npm)"; exit 2; }
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  (cd "$$tmp" && npm pack --silent mermaid@$(MERMAID_VERSION) >/dev/null && tar xzf mermaid-$(MERMAID_VERSION).tgz) && \
	  cp "$$tmp/package/dist/mermaid.min.js" "$$tmp/package/LICENSE" $(MERMAID_DIR)/ && \
	  { echo "version: $(MERMAID_VERSION)"; \
	    echo "source: npm pack mermaid@$(MERMAID_VERSION) (npm checks the registry's integrity hash): package/dist/mermaid.min.js and package/LICENSE (MIT)"; \
	    echo "sha256: $$(sha256sum $(MERMAID_DIR)/mermaid.min.js | cut -d' ' -f1)"; \
	    echo "update: make vendor-mermaid MERMAID_VERSION=11.x.y (tests/docs/test_site.py checks this file against mermaid.min.js)"; \
	  } > $(MERMAID_DIR)/VERSION
	@cat $(MERMAID_DIR)/VERSION

# uPlot draws `pgpoll report`'s charts, inlined into the page (package data). make vendor-uplot UPLOT_VERSION=1.6.x
UPLOT_VERSION ?= 1.6.32
UPLOT_DIR := pgpoll/observe/vendor/uplot
vendor-uplot:
	@command -v npm >/dev/null 2>&1 || { echo "vendor-uplot needs npm (Debian: apt-get install npm)"; exit 2; }
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  (cd "$$tmp" && npm pack --silent uplot@$(UPLOT_VERSION) >/dev/null && tar xzf uplot-$(UPLOT_VERSION).tgz) && \
	  cp "$$tmp/package/dist/uPlot.iife.min.js" "$$tmp/package/dist/uPlot.min.css" "$$tmp/package/LICENSE" $(UPLOT_DIR)/ && \
	  { echo "version: $(UPLOT_VERSION)"; \
	    echo "source: npm pack uplot@$(UPLOT_VERSION) (npm checks the registry's integrity hash): package/dist/uPlot.iife.min.js, package/dist/uPlot.min.css and package/LICENSE (MIT)"; \
	    echo "sha256: $$(sha256sum $(UPLOT_DIR)/uPlot.iife.min.js | cut -d' ' -f1)"; \
	    echo "update: make vendor-uplot UPLOT_VERSION=1.6.x (tests/observe/test_report.py checks this file against uPlot.iife.min.js)"; \
	  } > $(UPLOT_DIR)/VERSION
	@cat $(UPLOT_DIR)/VERSION

# What a Spark cluster needs: the wheel (pip install it where pgpoll should be installed), the same
# wheel as dist/pgpoll.zip (spark-submit --py-files puts only .zip/.egg/.jar files on the executors'
# sys.path; a pure-Python wheel is a zip with the package at its root) and the entry scripts, ingest.py
# materialize.py, snapshot.py and housekeeping.py. The same zip carries format("pgpoll") for an application's own Spark code
# (pgpoll.spark.register(spark), and pyspark_pgpoll.py at its root for Spark's lookup of Python data sources).
DIST ?= dist
dist: $(VENV)/.installed
	@mkdir -p $(DIST)
	rm -rf build $(DIST)/pgpoll-*.whl $(DIST)/pgpoll.zip $(DIST)/ingest.py $(DIST)/materialize.py $(DIST)/snapshot.py $(DIST)/housekeeping.py $(DIST)/log4j2.properties  # a stale build/ puts deleted modules in the wheel
	$(PY) -m pip wheel -q --no-deps --wheel-dir $(DIST) .
	cp $(DIST)/pgpoll-*-py3-none-any.whl $(DIST)/pgpoll.zip
	cp jobs/ingest.py $(DIST)/ingest.py
	cp jobs/materialize.py $(DIST)/materialize.py
	cp jobs/snapshot.py $(DIST)/snapshot.py
	cp jobs/housekeeping.py $(DIST)/housekeeping.py
	cp pgpoll/spark/log4j2.properties $(DIST)/log4j2.properties
	@echo "built $(DIST)/: $$(cd $(DIST) && ls pgpoll-*.whl) pgpoll.zip ingest.py materialize.py snapshot.py housekeeping.py log4j2.properties"

# Airflow pins many packages, so it gets its own virtualenv. Airflow's constraint files are on GitHub;
# where that is reachable, pass one: make airflow-venv AIRFLOW_CONSTRAINTS=https://.../constraints-3.11.txt
AIRFLOW_VENV ?= .venv-airflow
AIRFLOW_CONSTRAINTS ?=
$(AIRFLOW_VENV)/.installed: | prereqs
	$(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/python -m pip install -q --upgrade pip
	$(AIRFLOW_VENV)/bin/python -m pip install -q $(if $(AIRFLOW_CONSTRAINTS),--constraint $(AIRFLOW_CONSTRAINTS)) \
	  "apache-airflow>=3,<4" apache-airflow-providers-apache-spark
	@touch $@

# pgpoll goes into it without its dependencies, as into a user's Airflow (the DAG file imports pgpoll.airflow,
# which needs only Airflow and the standard library); editable, so the DAG test sees this checkout.
$(AIRFLOW_VENV)/.pgpoll-installed: $(AIRFLOW_VENV)/.installed pyproject.toml
	$(AIRFLOW_VENV)/bin/python -m pip install -q --no-deps -e .
	@touch $@

airflow-venv: $(AIRFLOW_VENV)/.pgpoll-installed
	@$(AIRFLOW_VENV)/bin/airflow version

clean:
	rm -rf $(VENV) build dist *.egg-info .demo site
