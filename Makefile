# The two commands of README.md: `make demo` runs the main job, `make test` runs every test.
SHELL := /bin/bash
export PATH := $(CURDIR)/.venv/bin:$(PATH)
PYTEST_ARGS ?= --durations=30
# two workers, each with servers of its own (tests/conftest.py, pytest_xdist_make_scheduler)
PYTEST_WORKERS ?= 2

.PHONY: setup test lint lint-only demo bench clean
DEMO_ARGS ?=

setup:
	@hack/setup.sh

lint: setup
	@$(MAKE) --no-print-directory lint-only

lint-only:
	ruff check sparkapp sinkoperator tests bench hack
	mypy sparkapp sinkoperator bench hack
	NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir .site

# The sharding e2e tests run the job in-process (they act on its chdb engine while it runs), so they get a
# pytest process, and a Spark driver, of their own.
# The Kubernetes parts build in the background meanwhile (hack/setup.sh test).
test:
	@hack/setup.sh test
	@$(MAKE) --no-print-directory lint-only
	pytest $(PYTEST_ARGS) -n $(PYTEST_WORKERS) --ignore=tests/e2e/test_sharding.py
	pytest $(PYTEST_ARGS) tests/e2e/test_sharding.py

# The demo provisions only what it uses (a JRE, Kafka, Spark's Kafka connector), not the Kubernetes parts.
demo:
	@hack/setup.sh demo
	python -m hack.demo $(DEMO_ARGS)

BENCH_ARGS ?=
bench: setup
	python -m bench $(BENCH_ARGS)

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache
