# The two commands in the README (make demo, make test) work from a fresh clone with only
# Python 3.11 and make: every install step lives here or in pyproject.toml.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test test-slow test-interop lint typecheck packaging-check demo docs docs-serve bench bench-quick clean

$(STAMP): pyproject.toml setup.py aioloader/arrayrecord/_highwayhash.c aioloader/arrayrecord/_footer.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The suite on two processes (pytest-xdist): each test is isolated in its own files, ports and
# leak check, so only the wall time changes. A single file: `$(PY) -m pytest tests/test_x.py`.
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q -p no:cacheprovider -n 2

test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow

# Google's array-record-beam-sdk as the oracle for `convert` on Beam (issue 18): it needs
# TensorFlow and pins array-record 0.5.0 (the dev extra pins 0.8.6), so it lives in a venv
# of its own. The first install downloads ~1 GB (TensorFlow, Beam[gcp]) and took ~12 min here.
INTEROP := .venv-interop
$(INTEROP)/.installed: pyproject.toml setup.py
	test -x $(INTEROP)/bin/python || $(PYTHON) -m venv $(INTEROP)
	$(INTEROP)/bin/python -m pip install --quiet --upgrade pip setuptools wheel
	$(INTEROP)/bin/python -m pip install --quiet array-record-beam-sdk==0.1.0 -e '.[beam]' \
	    pytest pytest-asyncio pytest-timeout psutil
	touch $@

test-interop: $(INTEROP)/.installed
	AIOLOADER_REQUIRE_INTEROP=1 $(INTEROP)/bin/python -m pytest -q -p no:cacheprovider \
	    tests/tools/test_beam.py -k array_record_beam_sdk

lint: $(STAMP)
	$(PY) -m ruff check .

# mypy (non-strict) over aioloader/, as configured in pyproject.toml.
typecheck: $(STAMP)
	$(PY) -m mypy

# Install as users and packagers do, in fresh venvs (no compiler, abi3 wheel, sdist, the
# testing extra): a few minutes and the package registry; run before a release.
packaging-check:
	bash tests/support/packaging_check.sh

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
	rm -rf $(VENV) $(INTEROP) build dist *.egg-info .mypy_cache aioloader/arrayrecord/*.so
