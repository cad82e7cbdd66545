"""A gs:// glob's listing needs gcsfs (~0.8 s to import): naming one in a pipeline starts
that import on a thread, so it overlaps the program's own start-up instead of the open."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_naming_a_gs_glob_starts_importing_gcsfs_and_nothing_else_does(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        import aioloader as al
        from aioloader import preimport
        assert "gcsfs" not in sys.modules  # importing aioloader does not
        al.Dataset.from_arrayrecord("gs://b/one.ar", storage_options={{"token": "anon"}})
        al.Dataset.from_arrayrecord({str(tmp_path)!r} + "/part-*.ar")
        assert not preimport._started  # a named object (anonymous) or local files: no listing
        al.Dataset.from_arrayrecord("gs://b/part-*.ar", storage_options={{"token": "anon"}})
        preimport._started["gcsfs"].result(120)
        assert "gcsfs" in sys.modules
        assert preimport.import_started("gcsfs") is preimport._started["gcsfs"]  # once
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
