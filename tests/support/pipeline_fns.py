"""Module-level transforms for pipeline tests (worker processes import them by name)."""

from __future__ import annotations

import json
import os
import signal
import threading

import numpy as np


def decode(record: bytes) -> dict:
    item = json.loads(record)
    return {"id": np.int64(item["id"]), "tokens": np.asarray(item["tokens"], dtype=np.int32)}


def just_id(element: dict) -> np.int64:
    return element["id"]


def augment(element: dict, rng: np.random.Generator) -> dict:
    return {**element, "noise": rng.integers(0, 1 << 30)}


def keep_even(element: dict) -> bool:
    return int(element["id"]) % 2 == 0


def only_tokens(element: dict) -> dict:
    return {"tokens": element["tokens"]}


def fail_on_13(element: dict) -> dict:
    if int(element["id"]) == 13:
        raise ValueError("thirteen is unlucky")
    return element


def crash_on_13(element: dict) -> dict:
    if int(element["id"]) == 13:
        os.kill(os.getpid(), signal.SIGKILL)
    return element


def crash_on(n: int, element: dict) -> dict:
    """Crash the interpreter on record `n` (bound with `functools.partial`)."""
    if int(element["id"]) == n:
        os.kill(os.getpid(), signal.SIGKILL)
    return element


def crash_once_on(marks: str, ids: frozenset, element: dict) -> dict:
    """Crash the interpreter the first time each of `ids` comes (a file in `marks` says it
    came): bound with `functools.partial`."""
    n = int(element["id"])
    if n in ids:
        mark = os.path.join(marks, str(n))
        if not os.path.exists(mark):
            open(mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    return element


def ids_of(batch) -> list[int]:
    return np.asarray(batch["id"]).tolist()


def only_id_noise(element: dict) -> dict:
    return {"id": element["id"], "noise": element["noise"]}


def only_id_noise_det(element: dict) -> dict:
    return {"id": element["id"]}


def id_and_text(element: dict) -> dict:
    """A string of ~1 KiB beside the id: batches of it are mostly not arrays."""
    i = int(element["id"])
    return {"id": element["id"], "text": f"{i:06d}" * 170}


def with_a_lock(element: dict) -> dict:
    """An element that cannot leave a worker process (a lock does not pickle), beside 4 KiB
    of array (a batch of them may not fit a small slot)."""
    import threading

    return {"id": element["id"], "pixels": np.zeros(4096, np.uint8), "lock": threading.Lock()}


def missing_key_on_13(element: dict) -> dict:
    i = int(element["id"])
    return {"id": i} if i == 13 else {"id": i, "x": 1}


def text_on_13(element: dict) -> dict:
    i = int(element["id"])
    return {"n": "thirteen" if i == 13 else i}


def keep_all(element) -> bool:
    return True


def slow_batch(batch):
    """A batch op that takes 2 ms: per-op timings must single it out."""
    import time

    time.sleep(0.002)
    return batch


def nap(seconds: float, batch):
    """A batch op that sleeps `seconds`: a task that keeps its worker busy, not a CPU."""
    import time

    time.sleep(seconds)
    return batch


def held_while(path: str, batch):
    """A batch op that waits while the file `path` exists (at most a minute): tasks held
    at their workers until a test lets them go."""
    import os
    import time

    deadline = time.monotonic() + 60
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    return batch


def as_uint8(record: bytes) -> np.ndarray:
    """A record's bytes as a uint8 array (big records: batches larger than a slot)."""
    return np.frombuffer(record, dtype=np.uint8)


def as_bytes(record: bytes) -> dict:
    """A record's bytes as they are (a batch of them is pickled into its slot)."""
    return {"b": bytes(record)}


def as_uint8_x4(record: bytes) -> np.ndarray:
    """Four times the record, so that the batch is larger than the files suggest."""
    return np.tile(np.frombuffer(record, dtype=np.uint8), 4)


def first_byte_even(element: np.ndarray) -> bool:
    return int(element[0]) % 2 == 0


def split_tokens(element: dict) -> list[dict]:
    """flat_map: one element per token (0..6 of them), each with its id and place."""
    i = int(element["id"])
    return [{"id": np.int64(i), "k": np.int64(k), "tokens": element["tokens"][: k + 1]}
            for k in range(len(element["tokens"]) - 1)]


def id_k(element: dict) -> dict:
    return {"id": element["id"], "k": element["k"]}


def id_k_noise(element: dict) -> dict:
    return {"id": element["id"], "k": element["k"], "noise": element["noise"]}


def not_k2(element: dict) -> bool:
    return int(element["k"]) != 2


def id_tokens(element: dict) -> dict:
    """To pack: a run of (id + 1)s, 1..5 long, so each packed segment names its record."""
    i = int(element["id"])
    return {"tokens": np.full(i % 5 + 1, i + 1, np.int32)}


def packed_ids(row: dict) -> list[int]:
    """The record ids of the segments of packed rows (`id_tokens`), row by row."""
    t, s = np.asarray(row["tokens"]), np.asarray(row["tokens_segment_ids"])
    out = []
    for tr, sr in zip(t.reshape(-1, t.shape[-1]), s.reshape(-1, s.shape[-1])):
        out += [int(tr[sr == g][0]) - 1 for g in np.unique(sr[sr > 0])]
    return out


def same_batches(a, b) -> None:
    """Two runs yielded the same dict batches: as many, same keys, equal arrays."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


ENTERED = threading.Event()  # set when `stuck_on_0` is entered (in this process)
RELEASE = threading.Event()  # set by a test to let a `stuck_on_0` left on a thread go


def stuck_on_0(element: dict) -> dict:
    """A transform that does not return on record 0 until `RELEASE` is set (in a worker
    process, never: the pool terminates it)."""
    if int(element["id"]) == 0:
        ENTERED.set()
        RELEASE.wait(60)
    return element

