"""Loader options: checked once, naming the option; flat and grouped forms are the same
loader; a misspelt option names the closest valid one; one place validates each op."""

from __future__ import annotations

import ast
import inspect
import json
import os
import pathlib

import pytest

import aioloader as al
from aioloader.index.sampling import Repeat

from ..support import pipeline_fns as fns


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    path = tmp_path_factory.mktemp("options") / "tiny.array_record"
    with al.ArrayRecordWriter(path, group_size=1) as w:
        for i in range(60):
            w.write(json.dumps({"id": i, "tokens": list(range(i % 7 + 1))}).encode())
    return str(path)


def _filtered(path):
    return (al.Dataset.from_arrayrecord(path).shuffle(seed=3).map(fns.decode)
            .filter(fns.keep_even).map(fns.only_id_noise_det).batch(4))


def _ids(loader):
    with loader:
        return [fns.ids_of(b) for b in loader]


@pytest.mark.parametrize("make, error, match", [
    (lambda: al.WorkerOptions(workers=-1), ValueError, r"workers must be >= 0, got -1"),
    (lambda: al.WorkerOptions(slot_size=0), ValueError, r"slot_size must be >= 1"),
    (lambda: al.WorkerOptions(window=0), ValueError, r"window must be >= 1 or None"),
    (lambda: al.PrefetchOptions(prefetch=0), ValueError, r"prefetch must be >= 1"),
    (lambda: al.ReadOptions(io_concurrency=0), ValueError, r"io_concurrency must be >= 1"),
    (lambda: al.ReadOptions(memory_budget=0), ValueError, r"memory_budget must be >= 1"),
    (lambda: al.ReadOptions(max_gap=-1), ValueError, r"max_gap must be >= 0 or None"),
    (lambda: al.ReadOptions(resident_bytes=-1), ValueError, r"resident_bytes must be >= 0"),
    (lambda: al.ReadOptions(retry=3), TypeError, r"retry must be an aioloader.RetryPolicy"),
    (lambda: al.WorkerOptions(workers=True), TypeError, r"workers must be an integer"),
    (lambda: al.ReadOptions(memory_budget=0.5), TypeError, r"memory_budget must be an integer"),
    (lambda: al.LoaderOptions(worker=2), TypeError, r"must be a WorkerOptions.*workers="),
])
def test_each_option_is_checked_with_an_error_naming_it(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_the_loader_checks_flat_options_the_same_way(path):
    ds = al.Dataset.from_arrayrecord(path)
    for kw, match in [({"workers": -1}, "workers"), ({"prefetch": 0}, "prefetch"),
                      ({"io_concurrency": 0}, "io_concurrency"), ({"window": 0}, "window")]:
        with pytest.raises(ValueError, match=match):
            ds.loader(**kw)
    with pytest.raises(TypeError, match="LoaderOptions"):
        ds.loader(options={"workers": 2})


def test_a_misspelt_option_names_the_closest_one_and_every_valid_one(path):
    ds = al.Dataset.from_arrayrecord(path)
    with pytest.raises(TypeError) as err:
        ds.loader(num_workers=2)
    text = str(err.value)
    assert "unknown option 'num_workers' (did you mean 'workers'?)" in text
    valid = text.partition("valid: ")[2].split(", ")
    assert set(al.LoaderOptions.field_names()) | {"read", "worker", "options", "state", "trace"} \
        == set(valid)
    with pytest.raises(TypeError, match=r"'prefetc' \(did you mean 'prefetch'\?\), 'zzz';"):
        ds.loader(zzz=1, prefetc=2)


def test_every_setting_is_a_keyword_of_loader():
    params = inspect.signature(al.Dataset.loader).parameters
    assert set(al.LoaderOptions.field_names()) <= set(params)


def test_whole_number_floats_are_taken_as_integers():
    read = al.ReadOptions(memory_budget=1e9, io_concurrency=8.0)
    assert read.memory_budget == 10**9 and type(read.memory_budget) is int
    assert type(read.io_concurrency) is int


def test_the_most_specific_setting_wins():
    base = al.LoaderOptions(read=al.ReadOptions(io_concurrency=7, max_gap=0),
                            worker=al.WorkerOptions(workers=1, window=32))
    got = base.merged(read=al.ReadOptions(io_concurrency=9), workers=3, prefetch=2)
    assert got.read == al.ReadOptions(io_concurrency=9)  # read= replaced options.read
    assert got.worker == al.WorkerOptions(workers=3, window=32)  # one field overridden
    assert got.prefetch == al.PrefetchOptions(prefetch=2)
    assert base.merged(max_gap=None) == base  # None: not given
    assert base.merged(read=al.ReadOptions(io_concurrency=9), io_concurrency=11) \
        .read.io_concurrency == 11


def test_grouped_and_flat_options_make_the_same_loader(path):
    """The window reaches the runtime either way: it is the state's unit with filter."""
    ds = _filtered(path)
    flat = ds.loader(workers=0, prefetch=2, io_concurrency=8, max_gap=0, window=8)
    grouped = ds.loader(read=al.ReadOptions(io_concurrency=8, max_gap=0),
                        worker=al.WorkerOptions(workers=0, window=8), prefetch=2)
    bundled = ds.loader(options=al.LoaderOptions(
        read=al.ReadOptions(io_concurrency=8, max_gap=0),
        worker=al.WorkerOptions(workers=0, window=8), prefetch=al.PrefetchOptions(prefetch=2)))
    assert flat.options == grouped.options == bundled.options
    assert flat.get_state()["unit"] == grouped.get_state()["unit"] == 8
    batches = _ids(flat)
    assert batches == _ids(grouped) == _ids(bundled)
    assert sorted(i for b in batches for i in b) == list(range(0, 60, 2))
    default = _ids(ds.loader(workers=0))  # the window does not change the batches
    assert default == batches


def test_each_op_is_validated_in_one_place(path):
    """The dataset verbs refuse what the ops refuse, with the ops' own messages."""
    ds = al.Dataset.from_arrayrecord(path)
    with pytest.raises(ValueError) as verb:
        ds.repeat(0)
    with pytest.raises(ValueError) as op:
        Repeat(0)
    assert str(verb.value) == str(op.value) == "Repeat num_epochs must be >= 1 or None, got 0"
    for bad, match in [(lambda: ds.shard(2, 2), r"Shard index must be in \[0, 2\)"),
                       (lambda: ds.shard(0, 0), "Shard count must be >= 1"),
                       (lambda: ds[::0], "Slice step must not be zero"),
                       (lambda: ds.shuffle(1, strategy="x"), "Shuffle strategy"),
                       (lambda: ds.block_shuffle(1, block_bytes=0), "block_bytes must be >= 1"),
                       (lambda: ds.batch(0), "batch size must be >= 1"),
                       (lambda: ds.pack({"t": 0}, num_packing_bins=2), r"length_struct\['t'\]"),
                       (lambda: ds.pack({"t": 4}, num_packing_bins=0), "num_packing_bins")]:
        with pytest.raises(ValueError, match=match):
            bad()


def test_errors_is_a_leaf_and_every_error_is_one_type():
    """errors.py imports only the format layer's error (and, lazily, the URL redactor)."""
    source = pathlib.Path(al.__file__).with_name("errors.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.ImportFrom) and node.level}
    assert imported == {"arrayrecord.errors", "urls"}
    from aioloader import errors
    from aioloader.describe.state import StateError
    from aioloader.errors import CollateError, TransformError
    from aioloader.io.storage import ObjectChangedError, StorageError, StoreUnavailableError
    from aioloader.tools.convert import ConvertError
    from aioloader.workers import WorkerError
    for old in (ConvertError, StateError, ObjectChangedError, StorageError,
                StoreUnavailableError, CollateError, TransformError, WorkerError,
                al.ArrayRecordFormatError):
        assert getattr(errors, old.__name__) is old is getattr(al, old.__name__)


def test_the_spill_settings_are_a_directory_and_a_size():
    read = al.ReadOptions(spill_dir=pathlib.Path("/var/tmp"), spill_bytes=1e9)
    assert read.spill_dir == "/var/tmp" and read.spill_bytes == 10**9
    assert al.ReadOptions().spill_dir is None and al.ReadOptions().spill_bytes is None
    with pytest.raises(ValueError, match="spill_dir must name a directory"):
        al.ReadOptions(spill_dir="")
    with pytest.raises(TypeError, match="spill_dir must be a path"):
        al.ReadOptions(spill_dir=3)  # type: ignore[arg-type]


def test_a_spill_dir_that_is_not_a_directory_is_refused_and_one_in_memory_is_warned(
        tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        al.ReadOptions(spill_dir=str(tmp_path / "missing"))
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ValueError, match="is not a directory"):
        al.ReadOptions(spill_dir=str(tmp_path / "file"))
    from aioloader.mounts import in_memory
    if not os.path.isdir("/dev/shm") or not in_memory("/dev/shm"):
        pytest.skip("no tmpfs at /dev/shm")
    with pytest.warns(UserWarning, match="held in memory"):
        al.ReadOptions(spill_dir="/dev/shm")
    with pytest.raises(ValueError, match="spill_bytes"):
        al.ReadOptions(spill_bytes=-1)
