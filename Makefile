# One command each: `make demo` sets up and runs the demo pipeline, `make test` runs the tests.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Delta's jars, resolved once into the venv: sessions start from them, without ivy.
JARS   := $(VENV)/share/autocdc/jars/autocdc-jars.json
# The classes a session loads, archived once: JVMs map them instead of loading them.
CLASSES := $(VENV)/share/autocdc/jars/autocdc-classes.json
SOURCES := autocdc tests pipelines benchmarks

.PHONY: setup demo test test-quick test-e2e lint bench bench-quick bench-smoke bench-snapshot bench-extract bench-kafka bench-pgbench bench-hotkey clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Resolved again when the coordinates change (a no-op when the marker matches them).
$(JARS): $(STAMP) autocdc/runtime/jars.py
	$(PY) -m autocdc.runtime.jars
	touch $(JARS)

$(CLASSES): $(JARS)
	$(PY) -m autocdc.engine.warmup

setup: $(STAMP) $(JARS) $(CLASSES)

demo: setup
	$(PY) -m autocdc run --spec pipelines/spark-pipeline.yml --full-refresh-all
	$(PY) pipelines/check.py

# Two pytest workers, each with its own Spark session: Spark spends much of a test waiting
# on the Delta log and on subprocesses, so two share the 2 cores well. Whole files go to the
# workers in the order tests/conftest.py sorts them (subprocess-heavy files first), not in
# xdist's own (files with more tests first), so no long file is left to run alone at the end.
PYTEST := $(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=15

# Every test that runs in the workers' own sessions; `test-e2e`: the tests that start
# processes (kills, spark-submit, notebooks, a wheel), servers (PostgreSQL), a cluster or
# a browser. CI runs both.
test: setup
	$(PY) -m ruff check $(SOURCES)
	$(PYTEST) -m "not e2e"

test-e2e: setup
	$(PYTEST) -m e2e

# The Spark-free tier (tests/conftest.py marks it): seconds, for the edit-test loop.
test-quick: setup
	$(PYTEST) -m quick

lint: setup
	$(PY) -m ruff check $(SOURCES)
	$(PY) -m ruff format --check $(SOURCES)

# Benchmarks: the full run writes benchmarks/BENCHMARKS.md and benchmarks/scaling.png.
bench: setup
	$(PY) benchmarks/run.py

bench-quick: setup
	$(PY) benchmarks/run.py --quick

bench-smoke: setup
	$(PY) benchmarks/run.py --smoke

# Snapshot flows only: 1M rows, 1% changed per snapshot, against a bare MERGE of the diff.
bench-snapshot: setup
	$(PY) benchmarks/run.py --snapshot

# Extraction through JDBC: a 1M-row table read by one partition against four.
bench-extract: setup
	$(PY) benchmarks/extraction.py

bench-kafka: setup
	$(PY) benchmarks/kafka.py

# PostgreSQL capture under pgbench's write load: live lag, catch-up after a stop, targets
# checked against the tables (pgbench -s 3, 150 s live, 150 s stopped).
bench-pgbench: setup
	$(PY) benchmarks/pgbench.py

# SCD type 2 with hot keys: one key with 100k versions a batch, and 3 keys with 30k.
bench-hotkey: setup
	$(PY) benchmarks/hotkey.py

clean:
	rm -rf $(VENV) warehouse spark-warehouse .pytest_cache .hypothesis
