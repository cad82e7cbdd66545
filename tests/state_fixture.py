"""Pipelines and digests behind tests/data/states_v1.json: states saved by an older aioloader
must resume bit-for-bit. `python -m tests.state_fixture` rewrote the JSON with the code of
commit 0e173c9 (before the runtime core was split); the test only reads it."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

import aioloader as al
from tests import pipeline_fns as fns

FIXTURE = Path(__file__).parent / "data" / "states_v1.json"


def write_files(root: Path) -> list[str]:
    """Two files, group sizes 1 and 4, 150 + 90 JSON records (contents fixed, not the bytes)."""
    paths = []
    for n, (count, group) in enumerate([(150, 1), (90, 4)]):
        path = root / f"part-{n}.array_record"
        with al.ArrayRecordWriter(str(path), group_size=group) as w:
            for i in range(count):
                rid = n * 1000 + i
                w.write(json.dumps({"id": rid, "tokens": list(range(rid % 7 + 1))}).encode())
        paths.append(str(path))
    return paths


def pipelines(paths: list[str]) -> dict[str, al.Dataset]:
    ds = al.Dataset.from_arrayrecord(paths)
    return {
        "batch": ds.shuffle(7).repeat(2).map(fns.decode).random_map(fns.augment)
                   .map(fns.only_id_noise).batch(8),
        "filter_batch": ds.shuffle(3).map(fns.decode).filter(fns.keep_even)
                          .map(fns.id_and_text).batch(8),
        "pack_batch": ds.map(fns.decode).map(fns.only_tokens)
                        .pack({"tokens": 16}, num_packing_bins=4).batch(2),
        "filter_elements": ds.shuffle(5).map(fns.decode).filter(fns.keep_even)
                             .map(fns.just_id),
    }


SKIP = {"batch": 5, "filter_batch": 3, "pack_batch": 3, "filter_elements": 7}


def digest(item) -> str:
    """A stable digest of a batch or element: keys, dtypes, shapes and bytes."""
    h = hashlib.sha256()

    def walk(x) -> None:
        if isinstance(x, dict):
            for k in sorted(x):
                h.update(repr(k).encode())
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            h.update(f"{type(x).__name__}{len(x)}".encode())
            for v in x:
                walk(v)
        else:
            a = np.asarray(x)
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())

    walk(item)
    return h.hexdigest()[:16]


def run(ds: al.Dataset, skip: int, state=None) -> tuple[dict, list[str]]:
    """(state after `skip` items, digests of the rest) — or, given `state`, (None, rest)."""
    if state is not None:
        return None, [digest(b) for b in ds.loader(workers=0, state=state)]
    it = ds.loader(workers=0)
    out, saved = [], None
    for k, b in enumerate(it):
        if k >= skip:
            out.append(digest(b))
        if k == skip - 1:
            saved = it.get_state()
    return saved, out


def main(root: str) -> None:
    paths = write_files(Path(root))
    cases = {}
    for name, ds in pipelines(paths).items():
        state, rest = run(ds, SKIP[name])
        # the state names the files by path: store it relative (the test fills the root in)
        state["pipeline"] = [ln.replace(root, "{root}") for ln in state["pipeline"]]
        cases[name] = {"state": state, "rest": rest}
    FIXTURE.write_text(json.dumps(cases, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
