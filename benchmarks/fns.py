"""Module-level transforms the pipeline benchmarks share with worker processes.

aioloader's workers are spawned processes that import transforms by name, so they live here,
in a module that imports nothing heavy; Grain runs the very same functions.
"""

from __future__ import annotations

import json

import numpy as np

IMAGE_SHAPE = (128, 128, 4)


def decode_text(record: bytes) -> dict:
    """The text workload's decode: `json.loads` of a ~1 KiB record."""
    return json.loads(record)


def identity(record: bytes) -> bytes:
    """The "no decode" variant: the record's bytes as they are."""
    return record


def decode_image(record: bytes) -> np.ndarray:
    """The image workload's decode: a zero-copy (128, 128, 4) uint8 view of the record."""
    return np.frombuffer(record, dtype=np.uint8).reshape(IMAGE_SHAPE)


def keep_even_label(element: dict) -> bool:
    """The filter workload's predicate: keeps the ~half of decoded records whose label is even."""
    return element["label"] % 2 == 0


def text_tokens(record: bytes) -> dict:
    """The pack workload's "tokenizer": `json.loads`, then 50–1000 int32 tokens (the record's
    bytes; the length follows the record's pseudo-random label, so it varies like real text)."""
    n = 50 + json.loads(record)["label"] * 951 // 1000
    return {"tokens": np.frombuffer(record, dtype=np.uint8, count=n).astype(np.int32)}


def augment_image(record: bytes) -> np.ndarray:
    """The NumPy-heavy workload: an image decoded, then float work over its pixels (gamma,
    a mirror, a contrast curve) back to uint8. NumPy releases the GIL inside each of these
    loops, so threads of one process can run them on several cores at once."""
    x = np.frombuffer(record, dtype=np.uint8).reshape(IMAGE_SHAPE).astype(np.float32)
    x = np.power(x * (1.0 / 255.0), 2.2)
    x = np.sqrt(x[:, ::-1] * 0.8 + 0.1)
    x = np.tanh(3.0 * (x - 0.5)) * 127.0 + 128.0
    return x.astype(np.uint8)


def decode_parquet_text(row: dict) -> dict:
    """The Parquet text workload's decode: `json.loads` of the row's ~1 KiB `text` column."""
    return json.loads(row["text"])


def collate_rows(rows: list[dict]) -> dict:
    """A batch of decoded rows as aioloader's `batch` makes it: numbers stacked into NumPy
    arrays, strings kept as lists (Grain's `batch_fn`, so both make the same batch)."""
    first = rows[0]
    return {k: [r[k] for r in rows] if isinstance(first[k], (str, bytes))
            else np.asarray([r[k] for r in rows]) for k in first}
