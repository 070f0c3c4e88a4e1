# The two commands of the README:
#   make demo   set up .venv and run the main job on the embedded default
#   make test   set up .venv and run the test suite (.ci/run runs `make lint`, then this)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: demo test lint bench generate tools lock docs clean

# dependencies from the lock file, every file checked against its hash, then Prism itself; the lock is
# resolved for Python 3.11 on Linux x86_64, so elsewhere the declared ranges are installed instead
LOCKED := $(shell $(PYTHON) -c 'import sys, platform; print(int(sys.version_info[:2] == (3, 11) and sys.platform == "linux" and platform.machine() == "x86_64"))' 2>/dev/null)
$(VENV)/.installed: pyproject.toml requirements-test.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
ifeq ($(LOCKED),1)
	$(PY) -m pip install --quiet --require-hashes -r requirements-test.lock
	$(PY) -m pip install --quiet --no-deps -e .
else
	@echo "note: requirements-test.lock is for Python 3.11 on Linux x86_64; installing the declared version ranges instead"
	$(PY) -m pip install --quiet -e '.[test,demo]'
endif
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/prism demo

# two pytest-xdist workers, a test file per worker at a time (a file's broker and cluster fixtures are made once):
# on a 2-core machine the suite took 28 min in one process, 14 in two (a third of its time is waiting on brokers
# and subprocesses); TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 2
test: $(VENV)/.installed tools
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

# ruff (pyproject.toml's [tool.ruff]: import order, bugbear, private access, relative imports) and mypy on prism,
# collectors and synthetic ([tool.mypy]); .ci/run runs this before the tests
lint: $(VENV)/.installed
	$(PY) -m ruff check . && $(PY) -m mypy

# Optional test tools from Debian's packages: promtool (package prometheus) runs the alert rules' unit tests,
# stunnel the TLS listener in front of the test broker (the bundled Tansu cannot serve TLS itself), openssl
# makes the tests' certificates. They are installed only where that needs no password (as root, or with
# passwordless sudo); elsewhere the tests that need them are skipped, and pytest names them and the reason.
TOOLS_PKGS := $(if $(shell command -v promtool),,prometheus) $(if $(shell command -v stunnel),,stunnel4) $(if $(shell command -v openssl),,openssl)
tools:
	@[ -z "$(strip $(TOOLS_PKGS))" ] || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi; \
	  if [ "$$SUDO" != none ] && command -v apt-get >/dev/null; then \
	    echo "installing optional test tools (apt-get install $(strip $(TOOLS_PKGS)))"; \
	    { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(strip $(TOOLS_PKGS)) >/dev/null; } \
	      || echo "note: could not install $(strip $(TOOLS_PKGS)); the tests that need them will be skipped"; \
	  else \
	    echo "note: $(strip $(TOOLS_PKGS)) not installed (needs root: apt-get install $(strip $(TOOLS_PKGS))); the tests that need them will be skipped"; \
	  fi; }

# alert rules, Grafana files and the chart's generated templates, from prism/deploy/alerting.py and prism/deploy/grafana.py
generate: $(VENV)/.installed
	$(VENV)/bin/prism alerts --out alerts --chart helm/prism

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_read_jobs.py
	$(PY) benchmarks/bench_long_job.py
	$(PY) benchmarks/bench_checkpoints.py
	$(PY) benchmarks/bench_replay_workers.py
	$(PY) benchmarks/bench_daemon.py
	$(PY) benchmarks/bench_collect.py
	$(PY) benchmarks/bench_whatif.py
	$(PY) benchmarks/bench_whatif_graph.py

# the documentation site in site/ (a broken link or anchor fails the build)
docs: $(VENV)/.installed
	$(PY) -m mkdocs build --strict

# re-pin after changing pyproject.toml: requirements.lock (the image: no test or demo extras, so no broker
# binary) and requirements-test.lock (CI and the two commands), hashed, for Linux x86_64 and Python 3.11
LOCK_TARGET := --python-version 3.11 --python-platform x86_64-unknown-linux-gnu --generate-hashes --custom-compile-command "make lock" --quiet
lock: $(VENV)/.installed
	$(PY) -m pip install --quiet 'uv>=0.5'
	$(VENV)/bin/uv pip compile pyproject.toml $(LOCK_TARGET) -o requirements.lock
	$(VENV)/bin/uv pip compile pyproject.toml --extra test --extra demo $(LOCK_TARGET) -o requirements-test.lock

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache site
