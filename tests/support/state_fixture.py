"""Pipelines and digests behind tests/support/data/states_v*.json: states saved by an older
aioloader must resume bit-for-bit. `python -m tests.support.state_fixture ROOT [v1|v2]` writes one
fixture; the test only reads them. v1 was written by commit 0e173c9 (before the runtime core
was split), v2 by commit 1bbe1a6 (before the modules moved into one folder per layer) and adds block
shuffles, mixes, concatenation, shards, flat_map and a state taken past an epoch's end."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

import aioloader as al
from tests.support import pipeline_fns as fns

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "states_v1.json"
FIXTURES = {"v1": FIXTURE, "v2": DATA / "states_v2.json"}


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


def pipelines_v2(paths: list[str]) -> dict[str, al.Dataset]:
    """What v2 adds: every index op and mixing verb, each with a state taken mid-stream."""
    ds = al.Dataset.from_arrayrecord(paths)
    one, two = (al.Dataset.from_arrayrecord([p]) for p in paths)
    return {
        "block_shuffle": ds.shuffle(11, strategy="block", block_bytes=512, window_bytes=2048)
                           .repeat(2).map(fns.decode).map(fns.just_id).batch(16),
        "mix": al.Dataset.mix([one.shuffle(1).repeat(3), two.shuffle(2).repeat(3)],
                              [0.7, 0.3], seed=5).map(fns.decode).map(fns.just_id).batch(8),
        "slice": ds.shuffle(21).repeat(2)[30:300].map(fns.decode).map(fns.just_id).batch(10),
        "concatenate": al.Dataset.concatenate([two, one.shuffle(4)]).repeat(2)
                         .map(fns.decode).map(fns.just_id).batch(16),
        "shard": ds.shuffle(9).repeat(3).shard(1, 3).map(fns.decode).random_map(fns.augment)
                   .map(fns.only_id_noise).batch(8, drop_remainder=True),
        "flat_map": ds.shuffle(13).map(fns.decode).flat_map(fns.split_tokens)
                      .filter(fns.not_k2).map(fns.id_k).batch(8),
    }


SKIP_V2 = {"block_shuffle": 17, "mix": 9, "slice": 14, "concatenate": 16, "shard": 12,
           "flat_map": 9}
CASES = {"v1": (pipelines, SKIP), "v2": (pipelines_v2, SKIP_V2)}


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


def run(ds: al.Dataset, skip: int, state=None, workers: int = 0) -> tuple[dict, list[str]]:
    """(state after `skip` items, digests of the rest) — or, given `state`, (None, rest)."""
    if state is not None:
        with ds.loader(workers=workers, state=state) as it:
            return None, [digest(b) for b in it]
    it = ds.loader(workers=0)
    out, saved = [], None
    for k, b in enumerate(it):
        if k >= skip:
            out.append(digest(b))
        if k == skip - 1:
            saved = it.get_state()
    return saved, out


def main(root: str, version: str = "v1") -> None:
    paths = write_files(Path(root))
    make, skips = CASES[version]
    cases = {}
    for name, ds in make(paths).items():
        state, rest = run(ds, skips[name])
        # the state names the files by path: store it relative (the test fills the root in)
        state["pipeline"] = [ln.replace(root, "{root}") for ln in state["pipeline"]]
        cases[name] = {"state": state, "rest": rest}
    FIXTURES[version].write_text(json.dumps(cases, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
