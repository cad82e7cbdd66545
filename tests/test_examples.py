"""Every example runs (tiny data), as CI's smoke test of the documented usage."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


def run(args: list[str], cwd, timeout: int = 300, env: dict | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          timeout=timeout)
    out = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("examples")
    run([os.path.join(EXAMPLES, "write_sample.py"), "data/sample", "--records", "3000"], root)
    return root


def test_async_training_loop(sample):
    out = run([os.path.join(EXAMPLES, "async_training_loop.py"), "--steps", "20"], sample)
    assert "20 steps" in out and "records/s" in out and "resume with" in out


def test_pack_text(sample):
    out = run([os.path.join(EXAMPLES, "pack_text.py"), "--batches", "3"], sample)
    assert "batch 2: tokens (16, 128)" in out and "next batch after resume" in out


def test_train_from_bucket_checkpoints_and_resumes(sample):
    out = run([os.path.join(EXAMPLES, "train_from_bucket.py"), "--steps", "40",
               "--batch", "64", "--records", "3000"], sample)
    assert "checkpointed at step 20" in out and "resumed at step 21" in out
    assert "step   36" in out  # the step counter goes on after the resume
    assert "training throughput" in out and "waiting for data" in out
    assert "loader start-up" in out and "loader stats for steps 21-40" in out


def test_multihost(sample):
    pytest.importorskip("jax")
    out = run([os.path.join(EXAMPLES, "multihost.py"), "--steps", "20", "--records", "3000"],
              sample)
    assert "2 processes trained 20 steps in lockstep" in out


def test_nnx_sharded_training_resumes_in_a_new_process(sample, tmp_path):
    """Seed 004: a Flax NNX block on a ('data', 'model') mesh of 8 CPU devices; model,
    optimizer and loader checkpointed with Orbax; a new process resumes with the same
    batches and losses, bit for bit."""
    pytest.importorskip("flax.nnx")
    pytest.importorskip("orbax.checkpoint")
    # The resumed process reuses the first one's compiled programs (as a restarted job would).
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8",  # the suite's is 4
           "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jit"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    out = run([os.path.join(EXAMPLES, "nnx_sharded_training.py"), "--steps", "5",
               "--save-at", "3", "--batch", "16", "--workers", "0"], sample, env=env)
    assert "mesh {'data': 4, 'model': 2}" in out
    assert "MLP kernel (64, 128) in shards of (64, 64)" in out  # split along 'model'
    first, _, second = out.partition("resuming in a new process")
    assert "restored step 3" in second
    before = [ln for ln in first.splitlines() if ln.startswith("step ")]
    after = [ln for ln in second.splitlines() if ln.startswith("step ")]
    assert [ln.split()[1] for ln in before] == ["1", "2", "3", "4", "5"]
    assert after == before[3:]  # steps 4 and 5: same loss and batch digest
    assert "resumed run matches: steps 4-5" in out


def test_grain_walkthrough(tmp_path):
    """Seed 002's notebook end to end: random access, graph, stats, workers running
    functions defined in `__main__`, start_prefetch."""
    out = run([os.path.join(EXAMPLES, "grain_walkthrough.py"), "--records", "2000",
               "--batch-size", "8", "--num-batches", "4", "--workers", "1",
               "--num-steps", "4", "--step-ms", "10", "--restore-s", "0.2"], tmp_path)
    assert "2000 examples" in out and "'label': 0" in out  # len(source), parsed_ds[0]
    assert "'description': array([  101," in out  # tokenized_ds[0], [CLS] first
    assert "12500 examples in shard 1 of 16" in out  # 2000 records x 100 epochs / 16
    assert "description_segment_ids" in out  # packed
    assert "map(tokenize)" in out and "pack({'description': 128}" in out  # graph, stats
    assert out.count("Iterator throughput") == 2
    assert out.count("of time waiting for data") == 2
