# The two commands of the README:
#   make demo   set up .venv and run the main job on the embedded default
#   make test   set up .venv and run the test suite (what .ci/run calls)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/prism demo

test: $(VENV)/.installed
	$(PY) -m pytest

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_read_jobs.py
	$(PY) benchmarks/bench_daemon.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
