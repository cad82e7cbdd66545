"""States saved by older code resume bit-for-bit (tests/data/states_v1.json, written by
`python -m tests.state_fixture` at commit 0e173c9, before the runtime core was split)."""

from __future__ import annotations

import json

import pytest

from tests import state_fixture as fx

CASES = json.loads(fx.FIXTURE.read_text())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat")
    return str(root), fx.write_files(root)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_state_saved_by_the_old_code_resumes_bit_for_bit(files, name):
    root, paths = files
    case = CASES[name]
    state = dict(case["state"])
    state["pipeline"] = [ln.replace("{root}", root) for ln in state["pipeline"]]
    _, rest = fx.run(fx.pipelines(paths)[name], 0, state=json.loads(json.dumps(state)))
    assert rest == case["rest"]
    assert len(rest) > 5  # enough batches after the state to mean something


def test_the_fixture_states_cover_skip_and_rows():
    """The stored states exercise every field the runtime must carry over."""
    states = [c["state"] for c in CASES.values()]
    assert any(s["skip"] for s in states) and any(s["rows"] for s in states)
    assert any(s["position"] and not s["skip"] for s in states)
