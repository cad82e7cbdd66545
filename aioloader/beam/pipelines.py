"""Conversion to ArrayRecord on Beam: the `aioloader convert` of one machine, on many.

Inputs are parsed by `aioloader.tools.convert.read_records`, the same code `convert` runs (TFRecord
CRC-checked, JSON lines validated, .npy rows, Parquet rows as JSON), one input file per work
item: files are the unit of parallelism (a TFRecord stream cannot be split without reading it),
so a job wants at least as many input files as workers. Two output layouts:

- `num_shards=N` (or 0: one per bundle): records are dealt to the sink's shards as any
  PCollection would be (`WriteToArrayRecord`);
- `match_shards=True`: one output shard per input file, records in input order, written
  straight from the file by one worker (no shuffle): `PREFIX-SSSSS-of-NNNNN` where shard k
  holds input k (inputs sorted as matched). The same temporary + finalize protocol applies.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

from ..tools.convert import guess_format, read_records
from .sink import WriteToArrayRecord, _finalize, _join, temp_dir_for, write_file
from .source import match_files

__all__ = ["ConvertToArrayRecord", "run_convert"]


class _Parse(beam.DoFn):
    """The records of one input file."""

    def __init__(self, storage_options: dict | None = None) -> None:
        self.storage_options = storage_options
        self.records = Metrics.counter("aioloader", "records")

    def process(self, item: tuple[str, str]) -> Iterator[bytes]:
        path, fmt = item
        for record in read_records(path, fmt, None, self.storage_options):
            self.records.inc()
            yield record


class _ConvertFile(beam.DoFn):
    """One input file to one temporary shard; emits `(shard, temporary path)`."""

    def __init__(self, temp_dir: str, *how: Any) -> None:
        self.temp_dir, self.how = temp_dir, how
        self.records = Metrics.counter("aioloader", "records")

    def process(self, item: tuple[int, str, str]) -> Iterator[tuple[int, str]]:
        k, path, fmt = item
        temp = _join(self.temp_dir, f"{k:05d}-{uuid.uuid4().hex}.array_record")
        records = read_records(path, fmt, None, self.how[2])  # (how: group size, codec, options)
        self.records.inc(write_file(temp, records, *self.how))
        yield k, temp


class ConvertToArrayRecord(beam.PTransform):
    """Convert input files (paths, URLs or globs; JSON lines, TFRecord, .npy, Parquet) to
    `PREFIX-SSSSS-of-NNNNN.array_record`. Applied to the pipeline; outputs the shard paths."""

    def __init__(self, inputs: str | Sequence[str], prefix: str, *, fmt: str | None = None,
                 num_shards: int = 0, match_shards: bool = False, group_size: int = 1,
                 compression: str = "zstd:3", storage_options: dict | None = None) -> None:
        super().__init__()
        if match_shards and num_shards:
            raise ValueError("match_shards makes one shard per input: leave num_shards at 0")
        self.inputs, self.prefix, self.fmt = inputs, prefix, fmt
        self.num_shards, self.match_shards = num_shards, match_shards
        self.how = (group_size, compression, storage_options)

    def files(self) -> list[tuple[str, str]]:
        """`(url, format)` of each input, in order; the format is checked now, not on a
        worker an hour into the job."""
        urls = [url for url, _ in match_files(self.inputs, self.how[2])]
        return [(url, self.fmt or guess_format(url)) for url in urls]

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        files = self.files()
        if not self.match_shards:
            return (pbegin
                    | "Inputs" >> beam.Create(files)
                    | "Spread" >> beam.Reshuffle()  # one file per work item, on any worker
                    | "Parse" >> beam.ParDo(_Parse(self.how[2]))
                    | "Write" >> WriteToArrayRecord(self.prefix, self.num_shards, *self.how))
        temp_dir = temp_dir_for(self.prefix)
        written = (pbegin
                   | "Inputs" >> beam.Create([(k, url, fmt) for k, (url, fmt) in enumerate(files)])
                   | "Spread" >> beam.Reshuffle()
                   | "Convert" >> beam.ParDo(_ConvertFile(temp_dir, *self.how)))
        return (pbegin
                | "Once" >> beam.Create([None])
                | "Finalize" >> beam.FlatMap(_finalize, self.prefix, temp_dir,
                                             beam.pvalue.AsList(written), len(files), *self.how))


def run_convert(inputs: Sequence[str], prefix: str, beam_args: Sequence[str] = (),
                **kw: Any) -> dict[str, Any]:
    """Run `ConvertToArrayRecord` with Beam pipeline options given as command-line words
    (`--runner=DataflowRunner --project=...`; default: the local runner) and wait for it.
    Returns `{"records": n, "shards": N}` (n from the job's metrics; None where the runner
    reports none, N None where the runner chose the count)."""
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.options.pipeline_options import PipelineOptions

    transform = ConvertToArrayRecord(inputs, prefix, **kw)
    num = len(transform.files()) if transform.match_shards else transform.num_shards
    p = beam.Pipeline(options=PipelineOptions(list(beam_args)))
    _ = p | "Convert" >> transform
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("records"))["counters"]
    records = sum(c.committed or 0 for c in counters) if counters else None
    return {"records": records, "shards": num or None}
