"""The headline table's pure parts (benchmarks/headline.py): pairing ratios, the machine label,
saving and reading a run, rendering the table, and replacing its block in RESULTS.md."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.common import Stats
from benchmarks.headline import (
    HISTORY,
    MARK_END,
    MARK_START,
    Line,
    add_arguments,
    from_json,
    machine_label,
    merge,
    merge_runs,
    paired,
    render,
    replace_block,
    run,
    to_json,
)


def _line(key: str = "text", workload: str = "text 1 KiB", ratio: float | None = 2.0) -> Line:
    return Line(key, workload, "rec/s", Stats(40e3, 50e3, 60e3), "Grain",
                Stats(20e3, 25e3, 30e3), None if ratio is None else Stats(1.5, ratio, 2.5),
                "2 × the bare loop", Stats(0.4, 0.5, 0.6), "workers=2",
                f"python -m benchmarks headline --only {key}", "abc1234", 2, 1.2, "full")


META = {"command": "python -m benchmarks headline --write", "date": "2026-11-27 19:00 UTC",
        "machine": "Xeon, 2 cores"}

INTRO = "# Benchmark results\n\nHow to read these tables.\n\n"
HISTORY_TEXT = ("## Older run (November 23)\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
                "## Another (November 27)\n\ntext\n")


def test_paired_takes_each_repeat_and_skips_missing_figures():
    assert paired([4.0, 6.0, None], [2.0, 2.0, 1.0]) == Stats(2.0, 2.5, 3.0)
    # costs (seconds): the peer's ÷ ours, so > 1 still means aioloader is better
    assert paired([0.5, 1.0], [1.0, 3.0], cost=True) == Stats(2.0, 2.5, 3.0)
    assert paired([None], [1.0]) is None


@pytest.mark.parametrize(("load", "word"), [(2.9, "quiet"), (3.0, "loaded"), (10.7, "loaded")])
def test_machine_label_is_quiet_below_one_and_a_half_per_core(load, word):
    assert machine_label(2, load).startswith(word)
    assert f"load {load:.1f}, 2 cores" in machine_label(2, load)


def test_machine_label_without_samples_says_so():
    assert "not sampled" in machine_label(2, None)


def test_a_saved_run_reads_back_the_same():
    lines = [_line(), _line("loop", "training loop", ratio=None)]
    back, meta = from_json(to_json(lines, META))
    assert back == lines
    assert meta == META


def test_render_has_one_row_per_line_with_the_ratios_command_commit_and_machine():
    block = render([_line(), _line("loop", "training loop", ratio=None)], META)
    assert block.startswith(MARK_START + "\n## Headline\n") and block.endswith(MARK_END)
    rows = [ln for ln in block.splitlines() if ln.startswith("| ")]
    assert rows[0].startswith("| workload | aioloader | peer | ratio [min–max] | ratio to the "
                              "limit | command to rerun | commit | machine |")
    assert rows[1] == ("| text 1 KiB | 50k rec/s [40k–60k] | Grain: 25k rec/s [20k–30k] | "
                       "**2.00×** [1.50–2.50] | 0.50× [0.40–0.60] of 2 × the bare loop | "
                       "`python -m benchmarks headline --only text` | abc1234 | "
                       "quiet (load 1.2, 2 cores) |")
    assert "| training loop | 50k rec/s [40k–60k] | Grain: 25k rec/s [20k–30k] | — |" in rows[2]
    assert "- text 1 KiB: workers=2" in block
    assert "not claims" not in block.replace("\n", " ")  # full-size rows only


def test_render_marks_quick_rows_as_a_smoke_test():
    quick = Line(**{**_line().__dict__, "size": "quick"})
    block = render([quick, _line("loop", "training loop")], META)
    assert "not claims" in block.replace("\n", " ")
    assert "| text 1 KiB (**--quick**: not a claim) |" in block
    assert "| training loop |" in block


def test_replace_block_inserts_after_the_intro_with_a_history_heading():
    text = INTRO + HISTORY_TEXT
    out = replace_block(text, render([_line()], META))
    assert out.startswith(INTRO + MARK_START)
    _, after = out.split(MARK_END)
    assert after == "\n\n" + HISTORY + "\n\n" + HISTORY_TEXT  # history untouched, below


def test_replace_block_is_idempotent_and_keeps_everything_outside_the_markers():
    block = render([_line()], META)
    once = replace_block(INTRO + HISTORY_TEXT, block)
    assert replace_block(once, block) == once
    # a new run replaces only the block; sections appended at the end stay as they are
    appended = once + "\n## A later section (November 28)\n\nmore\n"
    newer = render([_line(ratio=3.0)], META)
    out = replace_block(appended, newer)
    assert out == appended.replace(block, newer)
    assert out.count(MARK_START) == 1 and out.count(HISTORY + "\n") == 1


def test_replace_block_with_one_marker_refuses():
    with pytest.raises(ValueError):
        replace_block(INTRO + MARK_START + "\n" + HISTORY_TEXT, render([_line()], META))


def test_merge_replaces_the_rerun_rows_and_keeps_the_others_in_table_order():
    saved = [_line("text"), _line("open", "open"), _line("loop", "loop")]
    new = [_line("open", "open again", ratio=3.0)]
    merged = merge(saved, new)
    assert [x.workload for x in merged] == ["text 1 KiB", "open again", "loop"]


def test_merge_runs_keeps_each_row_with_the_run_that_measured_it():
    first = ([_line("text"), _line("open", "open")],
             {"command": "headline", "date": "d1", "machine": "m1"})
    second = ([_line("open", "open again")],
              {"machine": "m2", "runs": [{"command": "headline --only open", "date": "d2",
                                          "keys": ["open"]}]})
    lines, meta = merge_runs(first, second)
    assert [x.workload for x in lines] == ["text 1 KiB", "open again"]
    assert meta == {"machine": "m2", "runs": [
        {"command": "headline", "date": "d1", "keys": ["text"]},
        {"command": "headline --only open", "date": "d2", "keys": ["open"]}]}
    block = render(lines, meta)
    assert "Rows from these runs: `headline` (d1; rows: text); `headline --only open` (d2; " \
           "rows: open)." in block.replace("\n", " ")
    # a rerun of every row of a run drops that run
    _, meta = merge_runs((lines, meta), ([_line("text")], {"machine": "m3", "runs": [
        {"command": "c", "date": "d3", "keys": ["text"]}]}))
    assert [r["date"] for r in meta["runs"]] == ["d2", "d3"]


def test_from_json_write_renders_a_saved_run_into_the_file(tmp_path: Path, capsys):
    saved = tmp_path / "run.json"
    saved.write_text(to_json([_line()], META))
    results = tmp_path / "RESULTS.md"
    results.write_text(INTRO + HISTORY_TEXT)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--from-json", str(saved), "--write", "--results", str(results)]
    assert run(parser.parse_args(argv), argv) == 0
    first = results.read_text()
    assert "| text 1 KiB | 50k rec/s" in first and first.endswith(HISTORY_TEXT)
    assert (tmp_path / "headline.json").exists()  # saved beside the file written
    argv = ["--from-json", str(tmp_path / "headline.json"), "--write", "--results", str(results)]
    assert run(parser.parse_args(argv), argv) == 0
    assert results.read_text() == first
    assert MARK_START in capsys.readouterr().out
