"""Beam sink and source on Beam's local runners, array_record's reader as the oracle.

The write tests run on the in-process runners; the failure test on the bundle-based direct
runner, the one local runner that retries a failed bundle (as Dataflow does). The read test
runs the portable runner in multi-process mode (`direct_num_workers=2`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

beam = pytest.importorskip("apache_beam", reason="the `beam` extra is not installed")

import fsspec  # noqa: E402
from apache_beam.io import source_test_utils  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner  # noqa: E402
from apache_beam.testing.util import assert_that, equal_to  # noqa: E402
from fsspec.implementations.local import LocalFileSystem  # noqa: E402

from aioloader.beam import ReadFromArrayRecord, WriteToArrayRecord  # noqa: E402
from aioloader.beam.pipelines import ConvertToArrayRecord  # noqa: E402
from aioloader.beam.sink import finalize_shards, temp_dir_for, write_file  # noqa: E402
from aioloader.beam.source import _FileSource  # noqa: E402
from aioloader.tools.convert import convert, write_tfrecord  # noqa: E402

from ..support.arrayrecord_util import read_theirs, write_theirs  # noqa: E402


def _pipeline(**options) -> beam.Pipeline:
    """A local pipeline that does not parse pytest's command line as Beam options."""
    runner = options.pop("runner", None)
    return beam.Pipeline(runner=runner, options=PipelineOptions([], **options))


RECORDS = [b"record-%05d-" % i + bytes([i % 251]) * (i % 37) for i in range(10_000)]


def _tree(path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), path)
                  for d, dirs, files in os.walk(path) for f in files + dirs)


def test_three_shards_from_10k_records_read_back_by_array_record(tmp_path):
    with _pipeline() as p:
        placed = (p | beam.Create(RECORDS)
                  | WriteToArrayRecord(str(tmp_path / "out"), num_shards=3, group_size=16))
        assert_that(placed, equal_to([str(tmp_path / f"out-0000{k}-of-00003.array_record")
                                      for k in range(3)]))
    names = _tree(tmp_path)
    assert names == [f"out-0000{k}-of-00003.array_record" for k in range(3)]  # no temp left
    shards = [read_theirs(tmp_path / n) for n in names]
    assert all(len(s) > 3000 for s in shards)  # dealt round-robin: about a third each
    assert Counter(r for s in shards for r in s) == Counter(RECORDS)


def test_one_shard_per_bundle_and_empty_shards(tmp_path):
    with _pipeline() as p:
        _ = p | beam.Create(RECORDS[:100]) | WriteToArrayRecord(str(tmp_path / "b/x"))
        _ = p | "few" >> beam.Create(RECORDS[:2]) | "w5" >> WriteToArrayRecord(
            str(tmp_path / "c/y"), num_shards=5, compression="uncompressed")
    got = [r for n in _tree(tmp_path / "b") for r in read_theirs(tmp_path / "b" / n)]
    assert Counter(got) == Counter(RECORDS[:100])
    assert all(n.endswith(".array_record") for n in _tree(tmp_path / "b"))
    few = _tree(tmp_path / "c")
    assert few == [f"y-0000{k}-of-00005.array_record" for k in range(5)]
    assert sorted(r for n in few for r in read_theirs(tmp_path / "c" / n)) == RECORDS[:2]


class _Flaky(LocalFileSystem):
    """Local files whose first write into a Beam temporary fails after 20 kB: a worker dying
    halfway through a shard."""

    protocol = ("flaky",)
    failures = 0

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(str(path).removeprefix("flaky://"))

    def _open(self, path, mode="rb", **kw):
        if "w" in mode:
            os.makedirs(os.path.dirname(self._strip_protocol(path)), exist_ok=True)
        f = super()._open(path, mode, **kw)
        if "w" in mode and ".beam-temp-" in str(path) and _Flaky.failures == 0:
            written = [0]
            real_write = f.write

            def write(data):
                written[0] += len(data)
                if written[0] > 20_000 and _Flaky.failures == 0:
                    _Flaky.failures += 1
                    raise OSError("injected: the worker died mid-write")
                return real_write(data)

            f.write = write
        return f


def test_a_bundle_that_fails_mid_write_leaves_no_partial_or_duplicate_shard(tmp_path):
    fsspec.register_implementation("flaky", _Flaky, clobber=True)
    _Flaky.failures = 0
    with _pipeline(runner=BundleBasedDirectRunner()) as p:
        _ = (p | beam.Create(RECORDS)
             | WriteToArrayRecord(f"flaky://{tmp_path}/out", num_shards=3))
    assert _Flaky.failures == 1  # it did fail, and the retried bundle succeeded
    names = _tree(tmp_path)
    assert names == [f"out-0000{k}-of-00003.array_record" for k in range(3)]
    got = [r for n in names for r in read_theirs(tmp_path / n)]
    assert len(got) == len(RECORDS) and Counter(got) == Counter(RECORDS)


def test_finalize_is_idempotent_and_refuses_a_shard_written_twice(tmp_path):
    prefix = str(tmp_path / "out")
    temp = temp_dir_for(prefix)
    results = [(k, f"{temp}/{k}-a.array_record") for k in range(2)]
    for k, path in results:
        write_file(path, RECORDS[k::2], 1, "zstd:3")
    write_file(f"{temp}/0-orphan.array_record", [b"partial"], 1, "zstd:3")  # a failed attempt
    finals = finalize_shards(prefix, temp, results, 2, 1, "zstd:3")
    assert finalize_shards(prefix, temp, results, 2, 1, "zstd:3") == finals  # a retry
    assert _tree(tmp_path) == [os.path.basename(f) for f in finals]
    assert [read_theirs(f) for f in finals] == [RECORDS[0::2], RECORDS[1::2]]
    with pytest.raises(RuntimeError, match="written twice"):
        finalize_shards(prefix, temp, [*results, (0, "x")], 2, 1, "zstd:3")


def _four_files(tmp_path) -> list[bytes]:
    expected = []
    for k, options in enumerate(["group_size:1", "group_size:64", "group_size:7,snappy",
                                 "group_size:1000,uncompressed"]):
        records = [b"f%d-%05d" % (k, i) for i in range(1000 + 500 * k)]
        write_theirs(tmp_path / f"in-{k}.array_record", records, options)
        expected += records
    return expected


# The multi-process runner leaves its gRPC server threads behind in this process.
@pytest.mark.allow_leaks
def test_read_four_files_multiprocess_yields_each_record_once(tmp_path):
    expected = _four_files(tmp_path)
    with _pipeline(direct_num_workers=2, direct_running_mode="multi_processing") as p:
        got = p | ReadFromArrayRecord(str(tmp_path / "in-*.array_record"))
        assert_that(got, equal_to(expected))  # a multiset: a duplicate or a loss fails


def test_splits_cut_on_chunk_boundaries_and_cover_the_file(tmp_path):
    path = tmp_path / "g64.array_record"
    records = [b"%06d" % i for i in range(1000)]
    write_theirs(path, records, "group_size:64")
    source = _FileSource(str(path), os.path.getsize(path))
    bundles = list(source.split(desired_bundle_size=1))
    assert [(b.start_position, b.stop_position) for b in bundles] == [
        (s, min(s + 64, 1000)) for s in range(0, 1000, 64)]
    source_test_utils.assert_sources_equal_reference_source(
        (source, None, None), [(b.source, b.start_position, b.stop_position) for b in bundles])
    assert sorted(source_test_utils.read_from_source(source)) == records


def test_dynamic_splits_at_any_record_lose_and_repeat_nothing(tmp_path):
    path = tmp_path / "g8.array_record"
    write_theirs(path, [b"%03d" % i for i in range(13)], "group_size:4")
    source = _FileSource(str(path), os.path.getsize(path))
    source_test_utils.assert_split_at_fraction_exhaustive(source)


def test_no_match_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no file matches"), _pipeline() as p:
        _ = p | ReadFromArrayRecord(str(tmp_path / "nothing-*.array_record"))


def test_write_and_read_back_through_gs_urls():
    """gs:// through gcsfs, against the GCS emulator over real HTTP."""
    from aioloader.testing import local_gcs

    with local_gcs() as gcs:
        opts = gcs.storage_options
        with _pipeline() as p:
            _ = (p | beam.Create(RECORDS[:500])
                 | WriteToArrayRecord(gcs.url("beam/out"), num_shards=2, group_size=8,
                                      storage_options=opts))
        assert sorted(gcs.list_objects("beam/")) == [
            f"beam/out-0000{k}-of-00002.array_record" for k in range(2)]  # no temporaries
        with _pipeline() as p:
            got = p | ReadFromArrayRecord(gcs.url("beam/out-*.array_record"),
                                          storage_options=opts)
            assert_that(got, equal_to(RECORDS[:500]))


# -- conversion ------------------------------------------------------------------------

JSON = [json.dumps({"i": i, "text": "x" * (i % 50)}).encode() for i in range(900)]


def _inputs(tmp_path, records, k: int, ext: str) -> list[str]:
    paths = []
    for j in range(k):
        path = tmp_path / "in" / f"part-{j}.{ext}"
        path.parent.mkdir(exist_ok=True)
        with open(path, "wb") as f:
            if ext == "tfrecord":
                write_tfrecord(f, records[j::k])
            else:
                f.write(b"\n".join(records[j::k]) + b"\n")
        paths.append(str(path))
    return paths


def test_jsonl_conversion_on_beam_holds_what_convert_writes(tmp_path):
    paths = _inputs(tmp_path, JSON, 3, "jsonl")
    convert(paths, str(tmp_path / "local" / "t"), shards=2)
    with _pipeline() as p:
        _ = p | ConvertToArrayRecord(str(tmp_path / "in" / "part-*.jsonl"),
                                     str(tmp_path / "beam" / "t"), num_shards=2)
    ours = [r for k in range(2) for r in read_theirs(tmp_path / f"beam/t-0000{k}-of-00002"
                                                                  ".array_record")]
    local = [r for k in range(2) for r in read_theirs(tmp_path / f"local/t-0000{k}-of-00002"
                                                                   ".array_record")]
    assert Counter(ours) == Counter(local) == Counter(JSON)


def test_tfrecord_match_shards_keeps_each_file_in_order(tmp_path):
    paths = _inputs(tmp_path, JSON, 4, "tfrecord")
    with _pipeline() as p:
        _ = p | ConvertToArrayRecord(paths, str(tmp_path / "t"), match_shards=True,
                                     group_size=8)
    for k in range(4):
        assert read_theirs(tmp_path / f"t-0000{k}-of-00004.array_record") == JSON[k::4]


def test_cli_runner_beam_passes_pipeline_options_and_refuses_existing_output(tmp_path):
    paths = _inputs(tmp_path, JSON, 2, "jsonl")
    out = str(tmp_path / "o" / "t")
    run = [sys.executable, "-m", "aioloader.tools.cli", "convert", *paths, out, "--runner", "beam",
           "--shards", "3", "--", "--runner=DirectRunner", "--direct_num_workers=1"]
    proc = subprocess.run(run, capture_output=True, timeout=180)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert b"wrote 900 records" in proc.stdout and b"-of-00003" in proc.stdout
    got = [r for k in range(3) for r in read_theirs(f"{out}-0000{k}-of-00003.array_record")]
    assert Counter(got) == Counter(JSON)
    again = subprocess.run(run, capture_output=True, timeout=180)
    assert again.returncode == 1 and b"already exists" in again.stderr
    bad = subprocess.run([*run[:6], out, "--", "--runner=DirectRunner"], capture_output=True,
                         timeout=60)
    assert bad.returncode != 0 and b"need --runner beam" in bad.stderr


def test_a_corrupt_tfrecord_fails_the_job_and_places_no_shard(tmp_path):
    paths = _inputs(tmp_path, JSON, 2, "tfrecord")
    damaged = bytearray(Path(paths[1]).read_bytes())
    damaged[14] ^= 1
    Path(paths[1]).write_bytes(bytes(damaged))
    with pytest.raises(Exception, match="checksum mismatch"), _pipeline() as p:
        _ = p | ConvertToArrayRecord(paths, str(tmp_path / "t"), num_shards=2)
    assert not list(tmp_path.glob("t-*"))


# Google's array-record-beam-sdk 0.1.0 cannot be a dev dependency: it requires TensorFlow and
# pins array-record==0.5.0 (we pin 0.8.6). `make test-interop` builds a venv of its own
# (the sdk with real TensorFlow 2.21, array-record 0.5.0, Beam 2.77) and runs this test there.
# Elsewhere, where the sdk is importable without TensorFlow (e.g. unpacked with
# `pip install --no-deps --target DIR array-record-beam-sdk==0.1.0` and DIR on PYTHONPATH),
# its real pipeline runs in a child with a stand-in `tensorflow` module: the conversion
# functions never call TensorFlow, only its demo data builder (imported at module top) does.
# Its `convert_tf_to_arrayrecord_disk_match_shards` cannot run on Beam 2.77 (it passes a side
# input as `num_shards`: "TypeError: '>=' not supported between instances of 'AsSingleton'
# and 'int'"), so ours is compared with its `convert_tf_to_arrayrecord_disk(num_shards=3)`.
_THEIRS = """
import importlib.util, sys, types
if importlib.util.find_spec("tensorflow") is None:  # real TensorFlow where installed
    sys.modules["tensorflow"] = types.ModuleType("tensorflow")
sys.argv = sys.argv[:1]
from apache_beam.options.pipeline_options import PipelineOptions
from array_record_beam_sdk import pipelines
pattern, prefix = sys.stdin.read().split()
p, _ = pipelines.convert_tf_to_arrayrecord_disk(
    num_shards=3, args={"input": pattern, "output": prefix}, pipeline_options=PipelineOptions([]))
p.run().wait_until_finish()
"""


def test_tfrecord_conversion_equals_array_record_beam_sdk(tmp_path):
    import importlib.util

    if importlib.util.find_spec("array_record_beam_sdk") is None:
        if os.environ.get("AIOLOADER_REQUIRE_INTEROP"):  # `make test-interop`: never a skip
            pytest.fail("array-record-beam-sdk is not importable in this environment")
        pytest.skip("array-record-beam-sdk is not importable (it needs TensorFlow and "
                    "array-record 0.5.0, so it is not in the dev extra)")
    _inputs(tmp_path, JSON, 3, "tfrecord")
    pattern = str(tmp_path / "in" / "part-*.tfrecord")
    proc = subprocess.run([sys.executable, "-c", _THEIRS], capture_output=True, timeout=180,
                          input=f"{pattern}\n{tmp_path / 'theirs' / 'out'}\n".encode())
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    with _pipeline() as p:
        _ = p | ConvertToArrayRecord(pattern, str(tmp_path / "ours" / "out"),
                                     match_shards=True)
    theirs = sorted((tmp_path / "theirs").iterdir())
    ours = sorted((tmp_path / "ours").iterdir())
    assert len(theirs) == len(ours) == 3  # both: one output shard per input shard
    assert (Counter(r for f in theirs for r in read_theirs(f))
            == Counter(r for f in ours for r in read_theirs(f)) == Counter(JSON))
