"""Convert record files (JSON lines, TFRecord, .npy, Parquet) to sharded ArrayRecord files.

Inputs (paths, URLs, or quoted globs expanded in sorted order, as on Beam) are read in order
and dealt round-robin to N shard writers, each on its own thread (compression releases the
GIL, so shards compress in parallel). Outputs are named `PREFIX-00000-of-00008.array_record`,
locally or at any fsspec URL (never with a query: it would end up in the names), written under
hidden temporary names and renamed into place only when every shard succeeded
(`aioloader.tools.staged`, which also removes what a killed run left). TFRecord is read without
TensorFlow: each record is `u64 length, u32 masked crc32c(length), data, u32 masked
crc32c(data)`, both checksums are verified, and no declared length is believed past the
bytes the file has left.

Typed records: rows of .npy inputs keep their raw bytes, and the arrays' dtype and row shape
are recorded as the element spec of every shard (`aioloader.elements.typed`), so `Dataset.
from_arrayrecord(..., decode="auto")` gives the arrays back; `decode_examples` turns
TFRecord `tf.train.Example`s into typed records of named fields (`aioloader.elements.tfexample`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import queue
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

import fsspec

from ..arrayrecord import ArrayRecordWriter
from ..elements.typed import ElementSpec
from ..errors import ConvertError, ElementSpecError, MissingExtraError
from ..formats.tfrecord import frame, masked_crc
from ..urls import has_glob, has_query, is_local, redact
from .staged import Staged, sweep_leftovers

log = logging.getLogger("aioloader")

FORMATS = ("jsonl", "tfrecord", "npy", "parquet")


def guess_format(path: str) -> str:
    name = path.lower().removesuffix(".gz")
    for suffix, fmt in ((".jsonl", "jsonl"), (".json", "jsonl"), (".ndjson", "jsonl"),
                        (".tfrecord", "tfrecord"), (".tfrecords", "tfrecord"),
                        (".npy", "npy"), (".parquet", "parquet")):
        if name.endswith(suffix) or f"{suffix}-" in name:
            return fmt
    raise ConvertError(f"{path}: cannot tell the input format from the name; pass --from")


def read_tfrecord(f: IO[bytes], path: str, verify: bool = True,
                  size: int | None = None) -> Iterator[bytes]:
    """Records of one TFRecord stream, checksums verified. A declared length is checked
    against the `size` of the stream (when known) before anything is read, and otherwise read
    in pieces, so a corrupt length is an error naming the record, never a huge allocation."""
    offset = 0
    while True:
        head = f.read(12)
        if not head:
            return
        if len(head) < 12:
            raise ConvertError(f"{path}: truncated record header at byte {offset}")
        length, length_crc = struct.unpack("<QI", head)
        if verify and masked_crc(head[:8]) != length_crc:
            raise ConvertError(f"{path}: length checksum mismatch at byte {offset} (corrupted "
                               "file, or not TFRecord)")
        left = None if size is None else size - offset - 12
        if left is not None and length + 4 > left:
            raise ConvertError(f"{path}: the record at byte {offset} declares {length:,} bytes, "
                               f"but the file has {max(left - 4, 0):,} left for it (corrupted "
                               "file, or not TFRecord)")
        data = _read_at_most(f, length)
        tail = f.read(4)
        if len(data) < length or len(tail) < 4:
            raise ConvertError(f"{path}: the record at byte {offset} is truncated: it declares "
                               f"{length:,} bytes, only {len(data):,} follow")
        if verify and masked_crc(data) != struct.unpack("<I", tail)[0]:
            raise ConvertError(f"{path}: data checksum mismatch in the record at byte {offset}")
        offset += 16 + length
        yield data


_PIECE = 64 << 20  # a record longer than this is read in pieces of this size


def _read_at_most(f: IO[bytes], n: int) -> bytes:
    """Up to `n` bytes of `f`: no more memory than the stream really holds."""
    if n <= _PIECE:
        return f.read(n)
    pieces = []
    while n > 0 and (piece := f.read(min(n, _PIECE))):
        pieces.append(piece)
        n -= len(piece)
    return b"".join(pieces)


def write_tfrecord(f: IO[bytes], records: Sequence[bytes]) -> None:
    """Write TFRecord framing (tests and users preparing fixtures)."""
    for r in records:
        f.write(frame(r))


def _read_jsonl(f: IO[bytes], path: str) -> Iterator[bytes]:
    for n, line in enumerate(f, 1):
        line = line.rstrip(b"\r\n")
        if not line.strip():
            continue
        try:
            json.loads(line)
        except ValueError as exc:
            raise ConvertError(f"{path}: line {n} is not JSON ({exc})") from None
        yield line


def _read_npy(path: str, specs: list | None = None,
              storage_options: dict | None = None) -> Iterator[bytes]:
    import numpy as np

    with fsspec.open(path, "rb", **(storage_options or {})) as f:
        arr = np.load(f, allow_pickle=False)
    if arr.ndim == 0:
        raise ConvertError(f"{path}: a scalar array has no rows to convert")
    if specs is not None:
        try:
            specs.append((path, ElementSpec.array(arr.dtype, arr.shape[1:])))
        except ElementSpecError as exc:  # e.g. a structured dtype: still converted, untyped
            specs.append((path, None))
            log.warning("%s: rows are stored untyped (%s)", redact(path), exc)
    for row in arr:
        yield np.ascontiguousarray(row).tobytes()


def _read_parquet(path: str, storage_options: dict | None = None) -> Iterator[bytes]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingExtraError("parquet", "reading Parquet", exc.name) from None
    with fsspec.open(path, "rb", **(storage_options or {})) as f:
        table = pq.read_table(f)
    for batch in table.to_batches():
        for row in batch.to_pylist():
            yield json.dumps(row, default=str).encode()


def read_records(path: str, fmt: str, specs: list | None = None,
                 storage_options: dict | None = None) -> Iterator[bytes]:
    """The records of one input file, in order (`specs`: .npy inputs append (path, spec);
    `storage_options` for fsspec)."""
    if fmt == "npy":
        yield from _read_npy(path, specs, storage_options)
        return
    if fmt == "parquet":
        yield from _read_parquet(path, storage_options)
        return
    if fmt not in FORMATS:
        raise ConvertError(f"unknown input format {fmt!r}; one of {FORMATS}")
    opened = fsspec.open(path, "rb", compression="infer", **(storage_options or {}))
    try:
        f = opened.open()
    except FileNotFoundError:  # fsspec's own text is garbled for names with `?` or `*`
        raise FileNotFoundError(errno.ENOENT, "no such file (or it cannot be reached)",
                                redact(path)) from None
    with f:
        if fmt == "jsonl":
            yield from _read_jsonl(f, redact(path))
        else:  # the stream's size, where it is the file's (not decompressed on the fly)
            size = getattr(f, "size", None) if opened.compression is None else None
            yield from read_tfrecord(f, redact(path), size=size)


def glob_matches(pattern: str, storage_options: dict | None = None) -> list[tuple[str, int]] | None:
    """`(url, size)` of each file a glob matches, sorted (FileNotFoundError: none), or None
    when `pattern` is no glob. Inputs are expanded so on every runner, this machine's too.
    A file named by the pattern's literal text (`data[12].jsonl`) wins over the glob."""
    if not has_glob(pattern):
        return None
    fs, path = fsspec.core.url_to_fs(pattern, **(storage_options or {}))
    if fs.isfile(path):
        return [(pattern, int(fs.size(path)))]
    found = fs.glob(path, detail=True)
    named = sorted((fs.unstrip_protocol(p) if "://" in pattern else p, int(info["size"]))
                   for p, info in found.items() if info.get("type") != "directory")
    if not named:
        raise FileNotFoundError(errno.ENOENT, "no file matches", redact(pattern))
    return named


def expand_inputs(patterns: Sequence[str], storage_options: dict | None = None) -> list[str]:
    """Every input named: each glob's files in sorted order, other names as they are."""
    out = []
    for pattern in patterns:
        matched = glob_matches(pattern, storage_options)
        out.extend([pattern] if matched is None else [url for url, _ in matched])
    return out


def check_output_prefix(prefix: str) -> None:
    """Refuse an output URL with a query: shard names are appended to the prefix, so the
    query (a signature, a token) would end up inside every object's name."""
    if not is_local(prefix) and has_query(prefix):
        raise ConvertError(f"{redact(prefix)}: an output URL takes no query string (shard "
                           "names are appended to it, so the query would become part of "
                           "every object's name); give the bucket path alone and credentials "
                           "through the environment or storage options")


def shard_paths(prefix: str, shards: int) -> list[str]:
    return [f"{prefix}-{k:05d}-of-{shards:05d}.array_record" for k in range(shards)]


def convert(
    inputs: Sequence[str],
    output_prefix: str,
    *,
    fmt: str | None = None,
    shards: int = 1,
    group_size: int = 1,
    compression: str = "zstd:3",
    progress: Callable[[int, int], Any] | None = None,
    overwrite: bool = False,
    decode_examples: bool | str | ElementSpec = False,
    storage_options: dict | None = None,
) -> dict[str, Any]:
    """Convert `inputs` to `shards` ArrayRecord files; returns counts, output paths and the
    element spec recorded (None for untyped records).

    `progress(records, bytes)` is called as records are written (from one thread). Existing
    output is refused (`FileExistsError`) unless `overwrite`; the shards appear only when the
    whole conversion succeeded, and a failed one leaves every existing file as it was.
    `decode_examples`: TFRecord inputs hold `tf.train.Example`s, stored as typed records by
    this feature description (`"label:int64,emb:float32[128]"` or an `ElementSpec`), or, with
    True, by the first Example's features. `storage_options` go to fsspec, for the inputs and
    the outputs alike.
    """
    if shards < 1:
        raise ValueError("shards must be >= 1")
    check_output_prefix(output_prefix)
    decoder = _example_decoder(decode_examples)
    options = dict(storage_options or {})
    inputs = expand_inputs(inputs, options)
    specs: list = []
    paths = shard_paths(output_prefix, shards)
    parent = os.path.dirname(output_prefix.removeprefix("file://"))
    if parent and is_local(output_prefix):
        os.makedirs(parent, exist_ok=True)
    staged = Staged(paths, overwrite, options)
    leftovers = sweep_leftovers(output_prefix, options)
    try:
        writers = [_writer(t, path, group_size, compression, options)
                   for t, path in zip(staged.open(), paths)]
    except BaseException:
        staged.discard()
        raise
    shard_threads = _ShardThreads(writers, staged, paths)
    ok = False
    try:
        count, size = _feed(inputs, fmt, decoder, specs, shard_threads, progress, options)
        ok = not shard_threads.errors
        spec = decoder.spec if decoder is not None else _common(specs, len(inputs))
        for w in writers:  # read when each writer closes, after the end of its queue
            w.element_spec = spec
    finally:
        shard_threads.close()
        try:
            if ok and not shard_threads.errors:
                staged.place()
        finally:
            staged.discard()  # what is left of the temporaries after success or failure
    if shard_threads.errors:
        raise shard_threads.errors[0]
    if progress is not None:
        progress(count, size)
    return {"records": count, "bytes": size, "outputs": paths, "element_spec": spec,
            "leftovers_removed": leftovers}


class _ShardThreads:
    """One thread per output shard, writing what its bounded queue brings; the errors are
    kept for the caller to raise after `close()` joins them."""

    def __init__(self, writers: list, staged: Staged, paths: list[str]) -> None:
        self.queues: list[queue.Queue] = [queue.Queue(maxsize=256) for _ in writers]
        self.errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._drain, args=(k, w, staged, paths[k]),
                                          name=f"aioloader-convert-{k}")
                         for k, w in enumerate(writers)]
        for t in self._threads:
            t.start()

    def _drain(self, k: int, writer: Any, staged: Staged, path: str) -> None:
        try:
            while (item := self.queues[k].get()) is not None:
                writer.write(item)
            writer.close()
            staged.finish(k)
        except BaseException as exc:  # reported after the join
            self.errors.append(_naming(exc, path))
            while self.queues[k].get() is not None:  # keep the producer from blocking
                pass

    def close(self) -> None:
        """End every queue and wait for the threads."""
        for q in self.queues:
            q.put(None)
        for t in self._threads:
            t.join()


def _feed(inputs: list[str], fmt: str | None, decoder: Any, specs: list,
          shards: _ShardThreads, progress: Callable[[int, int], Any] | None,
          storage_options: dict) -> tuple[int, int]:
    """Read every input's records, dealt round-robin to the shards' queues, until a shard
    fails; the records and bytes read."""
    count = size = 0
    queues = shards.queues
    for path in inputs:
        kind = fmt or guess_format(path)
        if decoder is not None and kind != "tfrecord":
            raise ConvertError(f"{path}: decode_examples needs TFRecord input, not {kind}")
        for n, record in enumerate(read_records(path, kind, specs, storage_options)):
            if decoder is not None:
                record = decoder(record, path, n)
            queues[count % len(queues)].put(record)
            count += 1
            size += len(record)
            if progress is not None and count % 1000 == 0:
                progress(count, size)
            if shards.errors:
                break
    return count, size


def _naming(exc: BaseException, path: str) -> BaseException:
    """A write error that names no file (ENOSPC, EIO: the OS names none) as one naming the
    shard it stopped."""
    if isinstance(exc, OSError) and not exc.filename:
        return OSError(exc.errno, f"{exc.strerror or exc}: writing {redact(path)}")
    return exc


def _writer(target: Any, path: str, group_size: int, compression: str,
            storage_options: dict) -> ArrayRecordWriter:
    try:
        return ArrayRecordWriter(target, group_size=group_size, compression=compression,
                                 storage_options=storage_options
                                 if isinstance(target, str) else None)
    except NotImplementedError:  # fsspec's http:// (and others) open files for reading only
        scheme = path.partition("://")[0]
        raise ConvertError(f"{redact(path)}: cannot write there: fsspec's {scheme}:// "
                           "filesystem does not write files; give a local path or a bucket "
                           "URL (gs://, s3://, ...)") from None


def _example_decoder(decode_examples: bool | str | ElementSpec) -> Any:
    if decode_examples is False or decode_examples is None:
        return None
    from ..elements.tfexample import ExampleDecoder, parse_features

    if decode_examples is True:
        return ExampleDecoder()
    if isinstance(decode_examples, str):
        return ExampleDecoder(parse_features(decode_examples))
    return ExampleDecoder(decode_examples)


def _common(specs: list, inputs: int) -> ElementSpec | None:
    """The spec every input gave (.npy rows), or None (logged when .npy inputs disagree)."""
    if len(specs) != inputs or not specs:
        return None
    first = specs[0][1]
    for path, spec in specs:
        if spec != first:
            log.warning("%s: rows are %s, %s's are %s: the output records no element spec",
                        redact(path), spec, redact(specs[0][0]), first)
            return None
    return first
