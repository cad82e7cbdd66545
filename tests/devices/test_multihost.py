"""Real multi-process JAX runs on localhost: sharded loading, global batches, elastic resume.

Each process is a separate interpreter that calls `jax.distributed.initialize` against a
coordinator on 127.0.0.1 and reads the same gs:// dataset from the emulator.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import aioloader as al
from aioloader.testing import local_gcs

from ..runtime.test_pipeline import _write
from ..support.pipeline_fns import decode, only_id_noise_det

pytest.importorskip("jax")

GLOBAL_BATCH = 16
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_processes(module: str, n: int, cfg: dict, timeout: float = 200,
                   **env_extra: str) -> None:
    """Run `n` processes of `module` (one JAX job, a coordinator on a free port) to the end;
    each must exit 0. Their output goes to files, not pipes: a pipe nobody reads while we
    wait on another process can fill and stall the whole job, and a pipe's EOF waits for
    every grandchild holding it. A job past `timeout` is asked for its threads' stacks
    (the workers register faulthandler on SIGUSR1) before it is killed, so a hang names
    where it hangs."""
    port = _port()
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu", **env_extra}
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile()) for _ in range(n)]
        procs = [subprocess.Popen([sys.executable, "-m", module, str(port), str(n), str(i),
                                   json.dumps(cfg)], cwd=ROOT, env=env, stdout=logs[i],
                                  stderr=subprocess.STDOUT)
                 for i in range(n)]
        deadline = time.monotonic() + timeout
        try:
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.1)
            hung = [i for i, p in enumerate(procs) if p.poll() is None]
            for i in hung:
                os.kill(procs[i].pid, signal.SIGUSR1)
            if hung:
                time.sleep(2)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
        outputs = []
        for f in logs:
            f.seek(0)
            outputs.append(f.read().decode(errors="replace"))
    if hung:
        pytest.fail(f"processes {hung} of {n} still running after {timeout:.0f} s:\n"
                    + "\n".join(f"--- process {i}:\n{outputs[i][-6000:]}" for i in range(n)))
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]


def _launch(n: int, cfg: dict, devices: int = 2) -> dict:
    """Run `n` processes of tests.support.multihost_worker with `devices` CPU devices each; process
    0's output, with `shards`: per batch, every device's (device id, first row, rows)."""
    _run_processes("tests.support.multihost_worker", n, cfg,
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    with open(cfg["out"]) as f:
        got = json.load(f)
    got["shards"] = []
    for i in range(n):
        with open(f"{cfg['out']}.{i}") as f:
            for step, held in enumerate(json.load(f)):
                if step == len(got["shards"]):
                    got["shards"].append([])
                got["shards"][step] += held
    return got


def _check_replicas(got: dict, global_batch: int) -> None:
    """Devices holding the same rows of a global batch (replicas over 'model') hold the
    same records, and the distinct blocks tile the global batch in order."""
    for step, (batch, held) in enumerate(zip(got["batches"], got["shards"])):
        blocks: dict[int, list[int]] = {}
        for _, start, rows in held:
            assert blocks.setdefault(start, rows) == rows, (step, held)
        tiled = [r for start in sorted(blocks) for r in blocks[start]]
        assert tiled == batch and len(set(batch)) == global_batch, (step, held)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    paths = _write(tmp_path_factory.mktemp("mh"), n=400, shards=4)
    with local_gcs() as gcs:
        urls = [gcs.upload(p, f"mh/{os.path.basename(p)}") for p in paths]
        cfg = {"urls": urls, "storage_options": gcs.storage_options, "seed": 11, "epochs": 2,
               "global_batch": GLOBAL_BATCH}
        ds = (al.Dataset.from_arrayrecord(urls, storage_options=gcs.storage_options)
              .shuffle(11).repeat(2).map(decode).map(only_id_noise_det)
              .batch(GLOBAL_BATCH, drop_remainder=True))
        reference = [np.asarray(b["id"]).tolist() for b in ds.loader()]
        yield cfg, reference


@pytest.mark.parametrize("n", [4])  # 2 processes: the layout tests below
def test_global_batches_equal_single_process_run(tmp_path, dataset, n):
    cfg, reference = dataset
    got = _launch(n, {**cfg, "out": str(tmp_path / "out.json"), "slices": n})
    assert got["processes"] == n and got["devices"] == 2 * n
    assert got["batches"] == reference
    _check_replicas(got, GLOBAL_BATCH)
    assert len(reference) == 2 * 400 // GLOBAL_BATCH


def test_elastic_resume_2_to_4(tmp_path, dataset):
    cfg, reference = dataset
    first = _launch(2, {**cfg, "out": str(tmp_path / "a.json"), "stop_after": 7, "slices": 2})
    assert first["batches"] == reference[:7]
    assert first["state"]["process_count"] == 2
    rest = _launch(4, {**cfg, "out": str(tmp_path / "b.json"), "state": first["state"],
                       "slices": 4})
    assert rest["batches"] == reference[7:]


# (processes, devices each, ('data', 'model') mesh, transposed grid, spec, data slices):
# 'model' across processes (replicas on other hosts load the same rows), and not.
LAYOUTS = {
    "4x1-model-across": (4, 1, (2, 2), False, "data", 2),  # slices: processes {0,1} {2,3}
    "4x1-interleaved": (4, 1, (2, 2), True, "tuple", 2),  # {0,2} {1,3}; P(('data',), None)
    "2x2-model-within": (2, 2, (2, 2), False, "tuple", 2),  # each process one slice
}


def _layout_run(tmp_path, dataset, layout: str, **extra) -> dict:
    """The layout's run over the whole dataset, checked against the single-process run:
    the same global batches, every device of a replica holding the same rows."""
    cfg, reference = dataset
    n, devices, mesh, transpose, spec, slices = LAYOUTS[layout]
    got = _launch(n, {**cfg, "out": str(tmp_path / "out.json"), "mesh": mesh,
                      "transpose": transpose, "spec": spec, "slices": slices, **extra},
                  devices)
    assert got["shapes"] == [[GLOBAL_BATCH] if spec == "data" else [GLOBAL_BATCH, 1]]
    assert got["batches"] == reference
    _check_replicas(got, GLOBAL_BATCH)
    return got


@pytest.fixture(scope="module")
def model_across(tmp_path_factory, dataset):
    return _layout_run(tmp_path_factory.mktemp("across"), dataset, "4x1-model-across",
                       keep_states=[7])


def test_model_axis_across_processes_gives_the_single_process_batches(model_across):
    """Processes 0 and 1 (and 2 and 3) are one model replica: they load the same rows, and
    the global batch is the per-process batch × 2 data slices (checked in the run)."""
    assert model_across["processes"] == 4
    assert model_across["states"]["7"]["process_count"] == 2  # the shard count


def test_elastic_resume_from_shared_slices_to_model_across_hosts(tmp_path, dataset,
                                                                 model_across):
    """A state of 4 processes in 2 data slices resumes exactly on 2 processes whose mesh
    puts 'model' across them (one data slice: both load every row)."""
    cfg, reference = dataset
    rest = _launch(2, {**cfg, "out": str(tmp_path / "b.json"), "mesh": (2, 2),
                       "transpose": True, "slices": 1, "state": model_across["states"]["7"]},
                   devices=2)
    assert rest["batches"] == reference[7:]
    _check_replicas(rest, GLOBAL_BATCH)


def test_model_within_processes_and_layouts_that_cannot_be_served(tmp_path, dataset):
    """2 processes x 2 devices, 'model' within each (a P(('data',), None) spec); and, in
    the same processes, the layouts refused before the first batch, each saying why."""
    got = _layout_run(tmp_path, dataset, "2x2-model-within", refusals=True)
    said = got["refusals"]
    assert "needs the batch's sharding" in said["unknown"]
    assert "to_jax(sharding)" in said["unknown"]
    assert "not one contiguous range" in said["interleaved"]
    assert "give both the same sharding" in said["mismatch"]


@pytest.mark.slow
def test_interleaved_replicas_load_the_same_rows(tmp_path, dataset):
    """Slices of processes {0, 2} and {1, 3}: shards by slice, not by process index."""
    _layout_run(tmp_path, dataset, "4x1-interleaved")


def _launch_stream(n: int, cfg: dict) -> list[int]:
    """Record ids yielded by all `n` processes of tests.support.elastic_stream_worker."""
    _run_processes("tests.support.elastic_stream_worker", n, cfg)
    got = []
    for i in range(n):
        with open(os.path.join(cfg["out"], f"out-{i}.json")) as f:
            got += json.load(f)
    return got


@pytest.mark.parametrize("kind,old,new", [("pack", 2, 3), ("pack", 4, 2), ("batch", 2, 3)])
def test_elastic_resume_with_filter_consumes_every_record_once(tmp_path, kind, old, new):
    """filter + pack (or batch) on `old` real processes, saved with the Orbax handler,
    restored on `new` (the handler merges the old states): each record kept by the
    filter comes out exactly once over the two runs."""
    pytest.importorskip("orbax.checkpoint")
    paths = _write(tmp_path, n=300, shards=3)
    cfg = {"paths": paths, "kind": kind, "global_batch": 12, "window": 16}
    ckpt = str(tmp_path / "ckpt")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _launch_stream(old, {**cfg, "out": str(tmp_path / "a"), "stop": 3, "save": ckpt,
                                 "workers": 1 if old == 2 else 0})
    rest = _launch_stream(new, {**cfg, "out": str(tmp_path / "b"), "restore": ckpt})
    want = [i for i in range(300) if i % 2 == 0]  # ids 0..299 (tests.runtime.test_pipeline._write)
    assert sorted(first + rest) == want
    assert first and rest
