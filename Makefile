# pgpoll — set-up and everyday commands. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The test matrix: the full suite runs on the first version, the compatibility tests on all.
PGPOLL_TEST_PG ?= 15,16,17,18
export PGPOLL_TEST_PG

.PHONY: help prereqs install test demo bench clean

help:
	@echo "make demo   - set up .venv, start a throwaway PostgreSQL, fill a slot and show it"
	@echo "make test   - set up .venv and run the whole test suite"
	@echo "make bench  - run the benchmarks and print their figures"
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
	$(PY) -m pip install -q -e '.[test,matrix]'
	@touch $@

install: prereqs $(VENV)/.installed
	@$(PY) -m pgpoll.testing.prereqs

test: install
	$(PY) -m pytest

demo: install
	$(PY) -m pgpoll.testing.demo

bench: install
	$(PY) -m pgpoll.testing.prereqs
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build dist *.egg-info .demo
