"""Tests for engine/rprogram/trace.py and the RProgram JSON round trip (engine/rprogram/model.py)."""

from __future__ import annotations

import json

import pytest
from rprogram_plans import kernel, make_plan, random_plan

from engine.device import get_device
from engine.rprogram.model import RProgramError, rprogram_from_json, rprogram_to_json
from engine.rprogram.trace import export_trace, validate_trace, write_trace
from engine.rprogram.wavefront import build_rprogram

A100 = get_device("a100")


@pytest.mark.parametrize("seed", range(4))
def test_rprogram_json_round_trip(seed: int) -> None:
    rp = build_rprogram(random_plan(seed), A100)
    text = json.dumps(rprogram_to_json(rp))
    back = rprogram_from_json(json.loads(text))
    assert back == rp
    assert back.summary() == rp.summary()


def test_rprogram_json_rejects_other_input() -> None:
    with pytest.raises(RProgramError, match="no 'schema'"):
        rprogram_from_json({"x": 1})
    rp = build_rprogram(random_plan(0), A100)
    d = rprogram_to_json(rp)
    with pytest.raises(RProgramError, match="version 99"):
        rprogram_from_json({**d, "schema": 99})
    del d["vdevice"]
    with pytest.raises(RProgramError, match="malformed"):
        rprogram_from_json(d)


def test_trace_follows_the_rules_for_two_programs() -> None:
    a = build_rprogram(random_plan(1), A100)
    b = build_rprogram(random_plan(2), A100, merge=False)
    trace = export_trace([a, b])
    assert validate_trace(trace) == []
    assert trace["displayTimeUnit"] == "ns"
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"].startswith("rtask")]
    assert len(xs) == a.tasks + b.tasks
    assert {e["pid"] for e in xs} == {1, 2}
    assert all(e["args"]["source"] == "modeled" for e in xs)
    # Barriers on the control track of the unmerged program.
    barriers = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"].startswith("grid barrier")]
    assert len(barriers) == len(b.steps) - 1 + len(a.steps) - 1
    # The rTask events carry the schedule's times (offset by the launch) at ns resolution.
    first = min((t for ts in a.veus for t in ts), key=lambda t: (t.start_us, t.op))
    ev = next(e for e in xs if e["pid"] == 1 and e["name"] == first.op and e["args"]["block"] == first.block)
    assert ev["ts"] == pytest.approx(a.launch_us + first.start_us, abs=1e-3)


def test_validate_trace_flags_broken_traces() -> None:
    rp = build_rprogram(make_plan([kernel("a", 2), kernel("b", 2, deps=("a",))]), A100)
    trace = export_trace(rp)
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"].startswith("rtask")]
    e0 = xs[0]
    crossing = dict(e0, ts=e0["ts"] + e0["dur"] / 2, name="crossing")
    assert any("partially overlaps" in p for p in validate_trace(
        dict(trace, traceEvents=trace["traceEvents"] + [crossing])))
    nested = dict(e0, ts=e0["ts"] + e0["dur"] / 4, dur=e0["dur"] / 4, name="nested")
    assert validate_trace(dict(trace, traceEvents=trace["traceEvents"] + [nested])) == []
    unnamed = [e for e in trace["traceEvents"] if not (e["ph"] == "M" and e["name"] == "thread_name")]
    assert any("no thread_name" in p for p in validate_trace(dict(trace, traceEvents=unnamed)))
    noargs = dict(e0, args={"kernel": "a"})
    assert any("lacks args" in p for p in validate_trace(dict(trace, traceEvents=[*trace["traceEvents"], noargs])))
    assert validate_trace({"events": []}) == ["trace is not an object with a 'traceEvents' list"]
    assert any("displayTimeUnit" in p for p in validate_trace(dict(trace, displayTimeUnit="s")))


def test_write_trace(tmp_path) -> None:
    rp = build_rprogram(random_plan(3), A100)
    path = write_trace(rp, tmp_path / "t.json")
    assert validate_trace(json.loads(path.read_text())) == []
    with pytest.raises(RProgramError, match="cannot write"):
        write_trace(rp, tmp_path / "missing" / "t.json")
