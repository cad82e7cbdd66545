# The two commands in the README (make demo, make test) work from a fresh clone with only
# Python 3.11 and make: every install step lives here or in pyproject.toml.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test test-slow lint demo docs docs-serve bench bench-quick clean

$(STAMP): pyproject.toml setup.py aioloader/arrayrecord/_highwayhash.c aioloader/arrayrecord/_footer.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -p no:cacheprovider

test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow

lint: $(STAMP)
	$(PY) -m ruff check .

demo: $(STAMP)
	$(PY) examples/train_from_bucket.py --steps 300 --records 100000

# The documentation site (build/site), warnings as errors; tests/test_docs.py builds it too.
docs: $(STAMP)
	$(PY) -m mkdocs build --strict

docs-serve: $(STAMP)
	$(PY) -m mkdocs serve

bench: $(STAMP)
	$(PY) -m benchmarks run

bench-quick: $(STAMP)
	$(PY) -m benchmarks run --quick

clean:
	rm -rf $(VENV) build *.egg-info aioloader/arrayrecord/*.so
