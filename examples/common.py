"""Shared bits of the examples: the sample records' decoding and a tiny tokenizer.

The sample dataset (`examples/write_sample.py`) holds JSON records like AG News, the set
Grain's walkthrough uses: {"id", "label", "text"}. Functions here live at module level so
worker processes can import them.
"""

from __future__ import annotations

import json
import zlib

import numpy as np

VOCAB = 1024
SEQ = 64


def tokenize(text: str) -> np.ndarray:
    """Words hashed into a fixed vocabulary (id 0 is padding): a stand-in for a real one."""
    return np.array([1 + zlib.crc32(w.encode()) % (VOCAB - 1) for w in text.split()],
                    dtype=np.int32)


def parse(record: bytes) -> dict:
    item = json.loads(record)
    return {"label": np.int32(item["label"]), "tokens": tokenize(item["text"])}


def to_fixed(element: dict) -> dict:
    """Pad or trim tokens to SEQ, so elements stack into a batch."""
    tokens = element["tokens"][:SEQ]
    out = np.zeros(SEQ, dtype=np.int32)
    out[: len(tokens)] = tokens
    return {"label": element["label"], "tokens": out}


def only_tokens(element: dict) -> dict:
    return {"tokens": element["tokens"]}
