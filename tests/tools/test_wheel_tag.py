"""A wheel built without a C compiler is tagged as what it holds: pure Python.

setup.py's extensions are optional, so a build without a compiler succeeds with neither; the
wheel must then say `py3-none-any` and `Root-Is-Purelib: true`, not promise the platform
(`cp311-abi3-linux_x86_64`) it has no native code for. Built here without build isolation
(this venv's setuptools, no network: ~2 s of CPU); tests/support/packaging_check.sh builds
it as pip does, and the compiled abi3 wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_a_wheel_without_a_compiler_is_pure(tmp_path: Path) -> None:
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip("pyproject.toml's build needs setuptools >= 77")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "aioloader", src / "aioloader",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    env = {**os.environ, "CC": "false", "PIP_NO_INDEX": "1"}
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "-w", str(tmp_path / "out"), str(src)],
                          capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "out").iterdir()
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
    assert not [n for n in names if n.endswith((".so", ".pyd"))], names
    assert "Root-Is-Purelib: true" in meta and "Tag: py3-none-any" in meta, meta
    assert "aioloader/arrayrecord/hashing.py" in names  # the fallback it runs on
