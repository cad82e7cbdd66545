"""Run crafted hostile files (tests/support/hostile.py) through every read path, many in a child.

`verdict` reads a file as iteration, random access and the workers' batch decoder do: each
must give exactly the right records or an `ArrayRecordFormatError` naming the file.
`run_cases` runs cases in a child process under a 4 GiB address-space limit and reports
every case that kills the child, hangs over 10 s, grows it past 1 GiB of RSS, or gives
anything else. From the command line:

    python -m tests.support.hostile_run run SEED START STOP   # a range of cases, in children
    python -m tests.support.hostile_run case SEED I           # one case, in this process
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import subprocess
import sys
import time
import traceback

from aioloader.arrayrecord import ArrayRecordFormatError, RangeReader
from aioloader.arrayrecord.index import decode_records

from .hostile import make_case

NAME = "hostile.ar"
HANG_S = 10
MAX_RSS = 1 << 30
ADDRESS_SPACE = 4 << 30


# -- reading them every way the loader does -------------------------------------------------


def observe(data: bytes, *, verify: str, max_decoded: int | None = None) -> list[list[bytes]]:
    """Records as each read path returns them: iteration, random access, the workers' batch
    decoder. Raises what the reader raises."""
    kw = {} if max_decoded is None else {"max_decoded": max_decoded}
    reader = RangeReader(lambda o, n: data[o : o + n], len(data), path=NAME, verify=verify,
                         **kw)
    n = len(reader)
    out = [list(reader)]
    out.append(reader.read(list(range(n))[::-1])[::-1] if n else [])
    ix = reader.index
    chunks, within = ix.locate(range(n))
    ranges = [ix.chunk_range(int(c)) for c in chunks]
    out.append(decode_records(
        [data[s:e] for s, e in ranges], [s for s, _ in ranges], within.tolist(),
        verify=verify, paths=[NAME] * n, chunks=chunks.tolist(),
        counts=ix.chunk_records[chunks].tolist(), **kw))
    out.append(decoder_reads(data, ix, chunks, within, verify, kw))
    if n != len(out[0]):
        out.append([b"len() says %d" % n])
    return out


def decoder_reads(data: bytes, ix, chunks, within, verify: str | None,
                  kw: dict) -> list[bytes]:
    """The records as a worker reads them from a local file (`Decoder.records`: preads of
    its own, block headers put aside, one-record chunks on the short path); `verify` None:
    the default."""
    import tempfile

    import numpy as np

    from aioloader.index.planning import ChunkRefs
    from aioloader.workers.decode import Decoder

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, NAME)
        with open(path, "wb") as f:
            f.write(data)
        ranges = np.asarray([ix.chunk_range(int(c)) for c in chunks], dtype=np.int64)
        ranges = ranges.reshape(-1, 2)
        refs = ChunkRefs(paths=[path], file=np.zeros(len(chunks), np.int64),
                         chunk=np.asarray(chunks, np.int64), start=ranges[:, 0],
                         end=ranges[:, 1], within=np.asarray(within, np.int64),
                         count=ix.chunk_records[chunks], names=[NAME])
        dec = Decoder()
        try:
            if verify is not None:
                kw = dict(kw, verify=verify)
            return dec.records(refs, None, paths=[NAME] * len(chunks), **kw)
        finally:
            dec.close()


def verdict(data: bytes, records: list[bytes], *, verify: str,
            max_decoded: int | None = None) -> str | None:
    """None when every read path gives exactly `records` or an ArrayRecordFormatError that
    names the file; otherwise what went wrong."""
    try:
        results = observe(data, verify=verify, max_decoded=max_decoded)
    except ArrayRecordFormatError as err:
        return None if NAME in str(err) else f"error does not name the file: {err}"
    except Exception:
        return "another exception:\n" + traceback.format_exc()
    for got in results:
        if got != records:
            return f"wrong records: {_brief(got)} instead of {_brief(records)}"
    return None


def _brief(recs: list[bytes]) -> str:
    return f"{len(recs)} records of sizes {[len(r) for r in recs][:12]}"


# -- running many in a child ---------------------------------------------------------------


def _peak_rss() -> int:
    """This process's peak RSS since it started. Linux carries `ru_maxrss` across exec, so a
    child forked from a large test process would report the parent's size: read VmHWM (per
    address space) where there is one."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(seed: int, start: int, stop: int) -> None:
    """Run cases [start, stop) under the address-space limit; one line per case."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    out = sys.stdout
    for i in range(start, stop):
        out.write(f"@@start {i}\n")
        out.flush()
        try:
            case = make_case(seed, i)
            problem = verdict(case.data, case.records, verify=case.verify)
        except Exception:
            problem = "the generator failed:\n" + traceback.format_exc()
            case = None
        rss = _peak_rss()
        if problem is None and rss > MAX_RSS:
            problem = f"peak RSS {rss >> 20} MiB"
        if problem:
            text = f"{case or f'seed {seed} case {i}'}: {problem}"
            out.write(f"@@fail {i} {json.dumps(text)}\n")
        out.write(f"@@done {i}\n")
        out.flush()
        if rss > MAX_RSS:
            return  # the parent restarts a fresh child after this case


def run_cases(seed: int, start: int, stop: int, *, hang_s: float = HANG_S) -> list[str]:
    """Run cases [start, stop) in child processes; return a description of every failure.

    A child that dies (a signal, a non-zero exit), hangs for `hang_s` on one case or grows
    past `MAX_RSS` is replaced by a fresh one from the next case on.
    """
    failures: list[str] = []
    next_case = start
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))))
    while next_case < stop:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.hostile_run", "child", str(seed), str(next_case),
             str(stop)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root, env=env)
        current, buf = None, b""
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        last = time.monotonic()
        hung = False
        while True:
            if not sel.select(timeout=1.0):
                if current is not None and time.monotonic() - last > hang_s:
                    hung = True
                    proc.kill()
                    break
                if proc.poll() is not None:
                    break
                continue
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                text = line.decode("utf-8", "replace")
                if text.startswith("@@start "):
                    current, last = int(text.split()[1]), time.monotonic()
                elif text.startswith("@@fail "):
                    failures.append(json.loads(text.split(" ", 2)[2]))
                elif text.startswith("@@done "):
                    next_case, current = int(text.split()[1]) + 1, None
        sel.close()
        _, err = proc.communicate()
        if current is not None:  # it died or hung inside a case
            why = (f"hung for over {hang_s:.0f} s" if hung else
                   f"killed the child (exit {proc.returncode})")
            failures.append(f"{make_case(seed, current)}: {why}\n{err.decode()[-2000:]}")
            next_case = current + 1
        elif proc.returncode != 0 and next_case < stop:
            failures.append(f"child exited {proc.returncode} between cases: {err.decode()[-2000:]}")
            next_case += 1
    return failures


def main(argv: list[str]) -> int:
    if argv[:1] == ["child"]:
        _child(*map(int, argv[1:4]))
        return 0
    if argv[:1] == ["case"]:
        case = make_case(int(argv[1]), int(argv[2]))
        print(case)
        print(verdict(case.data, case.records, verify=case.verify) or "ok")
        return 0
    if argv[:1] == ["run"]:
        seed, start, stop = map(int, argv[1:4])
        began = time.monotonic()
        failures = run_cases(seed, start, stop)
        print("\n".join(failures))
        print(f"{stop - start} cases, {len(failures)} failures, "
              f"{time.monotonic() - began:.0f} s")
        return 1 if failures else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
