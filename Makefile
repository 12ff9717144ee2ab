# One command each: `make demo` sets up and runs the demo pipeline, `make test` runs the tests.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) -m autocdc run pipelines/demo.py --warehouse warehouse

test: setup
	$(PY) -m ruff check autocdc tests pipelines
	$(PY) -m pytest

lint: setup
	$(PY) -m ruff check autocdc tests pipelines
	$(PY) -m ruff format --check autocdc tests pipelines

clean:
	rm -rf $(VENV) warehouse spark-warehouse .pytest_cache .hypothesis
