"""The documentation builds with warnings as errors, and what it documents has docstrings."""

from __future__ import annotations

import dataclasses
import html
import inspect
import os
import re
import subprocess
import sys

import pytest

import aioloader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def own_docstring(cls: type) -> str:
    """The class's own docstring; a dataclass without one gets a generated "Name(field: ...)"
    signature, which does not count."""
    doc = (cls.__dict__.get("__doc__") or "").strip()
    return "" if doc.startswith(f"{cls.__name__}(") else doc


def test_every_public_class_has_its_own_docstring():
    classes = [getattr(aioloader, name) for name in aioloader.__all__]
    missing = [c.__name__ for c in classes if inspect.isclass(c) and not own_docstring(c)]
    assert not missing, f"public classes without a docstring: {missing}"


def test_readme_points_only_inside_the_repository():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert "../" not in text
    assert not re.search(r"\bseed \d{3}\b", text)  # the seeds are not shipped


def test_docs_build_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("Dataset", "Loader", "ReadOptions", "ArrayRecordSource", "LoaderSave"):
        assert f'id="aioloader.{name}"' in api or f'id="aioloader.jax.{name}"' in api, name
    check_dataset_section(api)


DATASET_FIELDS = tuple(f.name for f in dataclasses.fields(aioloader.Dataset))


def check_dataset_section(api: str) -> None:
    """The API page's `Dataset` leads with `from_arrayrecord`, shows none of its internal fields
    (no constructor signature of them, no base class), and lists every public method."""
    section = api[api.index('id="aioloader.Dataset"'):api.index('id="aioloader.Loader"')]
    lead = section[:section.index('id="aioloader.Dataset.from_arrayrecord"')]
    lead = html.unescape(re.sub(r"<[^>]+>", " ", lead))  # what the page shows above it
    for field in DATASET_FIELDS:  # as a signature shows them: `source: SourceSpec`, `x=()`
        assert not re.search(rf"\b{field}\s*[:=]", lead), field
    for internal in ("SourceSpec", "Stages", "index_ops", "batch_ops", "dataclass"):
        assert not re.search(rf"\b{internal}\b", lead), internal
    for field in DATASET_FIELDS:
        assert f'id="aioloader.Dataset.{field}"' not in section, field
    members = re.findall(r'id="aioloader\.Dataset\.(\w+)"', section)
    assert members[0] == "from_arrayrecord", members
    public = {name for name in dir(aioloader.Dataset) if not name.startswith("_")
              and callable(getattr(aioloader.Dataset, name))}
    assert set(members) == public, set(members) ^ public  # a new verb is listed in docs/api.md
