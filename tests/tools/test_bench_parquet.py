"""The Parquet benchmark's own logic (benchmarks/bench_parquet.py, benchmarks/parquet_peers.py)
on tiny files: the files it writes, that every contender reads each row once, shuffled, and
how its rows pair the runs. The Hugging Face peer is skipped when `datasets` is not installed
(`make test` does not install the `bench` extra)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.bench_parquet import local_rows, local_specs, parquet_shards, winner
from benchmarks.bench_pipeline import run_child
from benchmarks.parquet_peers import grain_dataset, hf_dataset, pyarrow_rows

N, SHARDS, GROUP = 400, 4, 50


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    args = argparse.Namespace(data_dir=tmp_path_factory.mktemp("pqbench"))
    return parquet_shards(args, N, SHARDS, GROUP)


def _ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


def test_the_files_hold_every_record_once_in_row_groups_of_the_size_asked(files):
    import pyarrow.parquet as pq

    ids = []
    for path in files:
        meta = pq.ParquetFile(path).metadata
        assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == \
            [GROUP] * (N // SHARDS // GROUP)
        table = pq.read_table(path)
        assert table.column_names == ["id", "text"]
        for i, text in zip(table.column("id").to_pylist(), table.column("text").to_pylist(),
                           strict=True):
            record = json.loads(text)
            assert record["id"] == i and len(text.encode()) == 1024
            ids.append(i)
    assert ids == list(range(N))


def test_the_limit_reads_every_row_in_file_order(files):
    assert [r["id"] for r in pyarrow_rows([str(p) for p in files])] == list(range(N))


def test_grain_reads_every_row_once_shuffled_in_batches_like_ours(files):
    spec = local_specs(files, 64, hf=False)["grain0"]
    batches = list(grain_dataset({**spec, "batch": 32}))
    assert isinstance(batches[0]["id"], np.ndarray) and isinstance(batches[0]["body"], list)
    ids = _ids(batches)
    assert sorted(ids) == list(range(N)) and ids != list(range(N))


@pytest.mark.parametrize("name", ["exact0", "block0"])
def test_aioloader_reads_every_row_once_shuffled(files, name):
    from benchmarks.contenders import _aio_dataset

    spec = local_specs(files, 64, hf=False)[name]
    with _aio_dataset({**spec, "batch": 32}).loader(workers=0) as it:
        ids = _ids(it)
    assert sorted(ids) == list(range(N)) and ids != list(range(N))


def test_hf_datasets_reads_every_row_once_shuffled(files):
    pytest.importorskip("datasets")
    spec = local_specs(files, 64, hf=True)["hf"]
    ids = _ids(hf_dataset({**spec, "batch": 32}))
    assert sorted(ids) == list(range(N)) and ids != list(range(N))


def test_a_peer_runs_in_a_fresh_process_and_counts_every_record(files):
    result = run_child(local_specs(files, 64, hf=False)["limit"], timeout=60)
    assert result["records"] == N and result["cpu"] > 0


# -- pairing --------------------------------------------------------------------------------


def _runs(rates: list[float], n: int = 1000) -> list[dict[str, Any]]:
    return [{"rate": r, "records": n, "wall": n / r, "cpu": n / r} for r in rates]


def test_rows_pair_ours_with_the_best_peer_of_each_repeat():
    res = {"exact0": _runs([100, 300]), "exact2": _runs([200, 100]),
           "block0": _runs([400, 400]), "block2": _runs([10, 10]),
           "grain0": _runs([50, 10]), "grain2": _runs([20, 20]),
           "hf": _runs([10, 100]), "limit": _runs([1000, 1000])}
    rows = {r.workload.split(": ", 1)[1]: r for r in local_rows(res, "t", hf=True)}
    best = rows["aioloader exact shuffle ÷ the best peer"]
    # repeat 1: ours 200 (workers 2) ÷ Grain 50; repeat 2: ours 300 (workers 0) ÷ HF 100
    assert (best.ratio.min, best.ratio.max) == pytest.approx((3.0, 4.0))
    assert "exact0 won 1, exact2 won 1" in best.note
    grain = rows["aioloader exact shuffle ÷ Grain ParquetIterDataset + shuffle buffer"]
    assert (grain.ratio.min, grain.ratio.max) == pytest.approx((4.0, 15.0))
    limit = rows["aioloader exact shuffle ÷ the limit"]
    assert limit.ratio.median == pytest.approx(0.25)
    assert winner(res, "block", None) == 0 and winner(res, "block", 2) == 2


def test_a_failed_contender_is_named_not_paired():
    res = {"exact0": _runs([100]), "exact2": _runs([100]), "block0": _runs([100]),
           "block2": _runs([100]), "grain0": [{"error": "exit code 1: boom"}],
           "grain2": _runs([50]), "hf": [{"error": "no result within 180 s"}],
           "limit": _runs([1000])}
    rows = local_rows(res, "t", hf=True)
    notes = " ".join(r.note for r in rows)
    assert "grain0 failed: exit code 1: boom" in notes and "hf failed" in notes
    assert rows[0].ratio.median == pytest.approx(2.0)  # Grain's mp run, the one that ran
