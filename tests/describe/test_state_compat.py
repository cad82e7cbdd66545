"""States saved by older code resume bit-for-bit (tests/support/data/states_v*.json, written by
`python -m tests.support.state_fixture ROOT VERSION`: v1 at commit 0e173c9, before the runtime
core was split; v2 at 1bbe1a6, before the modules moved into one folder per layer)."""

from __future__ import annotations

import json

import pytest

from tests.support import state_fixture as fx

FIXTURES = {v: json.loads(path.read_text()) for v, path in fx.FIXTURES.items()}
CASES = FIXTURES["v1"]
ALL = [(v, name) for v, cases in sorted(FIXTURES.items()) for name in sorted(cases)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat")
    return str(root), fx.write_files(root)


@pytest.mark.parametrize("version,name", ALL)
def test_a_state_saved_by_the_old_code_resumes_bit_for_bit(files, version, name):
    root, paths = files
    case = FIXTURES[version][name]
    state = dict(case["state"])
    state["pipeline"] = [ln.replace("{root}", root) for ln in state["pipeline"]]
    make = fx.CASES[version][0]
    _, rest = fx.run(make(paths)[name], 0, state=json.loads(json.dumps(state)))
    assert rest == case["rest"]
    assert len(rest) > 5  # enough batches after the state to mean something


@pytest.mark.parametrize("name", ["shard", "flat_map"])
def test_an_old_state_resumes_the_same_on_worker_processes(files, name):
    """The v2 states, resumed by two worker processes: the stream the old code wrote."""
    root, paths = files
    case = FIXTURES["v2"][name]
    state = dict(case["state"], pipeline=[ln.replace("{root}", root)
                                          for ln in case["state"]["pipeline"]])
    _, rest = fx.run(fx.pipelines_v2(paths)[name], 0, state=state, workers=2)
    assert rest == case["rest"]


def test_the_fixture_states_cover_skip_and_rows():
    """The stored states exercise every field the runtime must carry over."""
    states = [c["state"] for c in CASES.values()]
    assert any(s["skip"] for s in states) and any(s["rows"] for s in states)
    assert any(s["position"] and not s["skip"] for s in states)
