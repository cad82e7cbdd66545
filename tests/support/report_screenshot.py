"""The report's screenshot in the docs (docs/images/report.png): a small loader reads JSON
records from the local GCS emulator (30 ms a request, 1% of them failing and retried), with two
workers and a training step of 10 ms; its report is opened in headless Chromium and the top of
the page saved, in few colours (a small file).

    python -m tests.support.report_screenshot docs/images/report.png   (make docs-screenshot)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import aioloader as al
from aioloader.testing import local_gcs
from tests.support import browser


def _featurize(x: dict) -> int:
    return sum(len(t) for t in x["text"].split())


def run(out: str, seconds: float = 8.0) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "train.array_record"
        with al.ArrayRecordWriter(data, group_size=16) as w:
            for i in range(20_000):
                w.write(json.dumps({"id": i, "text": "lorem ipsum " * (i % 40)}).encode())
        with local_gcs(latency_ms=30, jitter_ms=5, error_rate=0.01,
                       proxy_process=True) as bucket:
            url = bucket.upload(data, "train.array_record")
            ds = (al.Dataset.from_arrayrecord(url, storage_options=bucket.storage_options)
                  .shuffle(0).repeat().map(json.loads).map(_featurize).batch(64))
            with ds.loader(workers=2, resident_bytes=0) as it:
                t0 = time.perf_counter()
                for _ in it:
                    time.sleep(0.01)  # the training step
                    if time.perf_counter() - t0 > seconds:
                        break
                page = it.stats().report(Path(tmp) / "report.html")
        shot = Path(tmp) / "shot.png"
        browser.screenshot(Path(page).as_uri(), str(shot), window=(1200, 1130))
        from PIL import Image

        Image.open(shot).convert("RGB").quantize(colors=48).save(out, optimize=True)
    return out


if __name__ == "__main__":
    print(run(sys.argv[1] if len(sys.argv) > 1 else "docs/images/report.png"))
