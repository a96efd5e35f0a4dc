# Two commands on a fresh machine: `make demo` and `make test`.
# `make demo` installs the core only (every method runs without the extras); the tests, the
# lint and the suite install `.[dev]`, which pulls every extra (`.[all]`).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: venv demo test lint bench bench-quick clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch is pinned and installed first so nothing else can pull another build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(DEV_STAMP)

venv: $(DEV_STAMP)

# runs/demo is replaced on every `make demo` (a plain `clusterfl demo` refuses a used folder)
demo: $(STAMP)
	$(VENV)/bin/clusterfl demo --overwrite

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy

# the tests in TEST_WORKERS processes (pytest-xdist), one thread each
TEST_WORKERS ?= 2

test: $(DEV_STAMP) lint
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -n $(TEST_WORKERS)

# The reproduction suite (about 2 hours on 2 cores; resumable: run it again to continue).
# Needs MNIST and Fashion-MNIST in $$CLUSTERFL_DATA (see `clusterfl data`).
BENCH_JOBS ?= 2

bench: $(DEV_STAMP)
	$(PY) benchmarks/engine.py
	$(PY) benchmarks/scaling.py
	OMP_NUM_THREADS=1 $(VENV)/bin/clusterfl bench --jobs $(BENCH_JOBS)

bench-quick: $(DEV_STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/clusterfl bench --quick --jobs $(BENCH_JOBS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
