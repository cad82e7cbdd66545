"""Every example runs (tiny data), as CI's smoke test of the documented usage."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


def run(args: list[str], cwd, timeout: int = 300) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT}
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
