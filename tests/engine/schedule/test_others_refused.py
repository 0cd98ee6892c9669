"""`validate.others_refused` (sched3 branch) skips a candidate of one segment of a multi-segment group
when another segment's tile is refused at the kernel's block: every time it says yes in a whole welder
walk (sample models, random graphs), `check_group` on tables of its own refuses the candidate too, with a
violation another segment's checks report alone, or rule 4's; and it says yes somewhere (not vacuous)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from fuzz_graphs import onnx_models
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from engine.device import get_device
from engine.errors import TileweaveError
from engine.frontend.importer import load_graph
from engine.memo import Caches
from engine.schedule import build, tiles, validate
from engine.schedule.pipeline import plan_model

SAMPLES = Path(__file__).resolve().parents[3] / "samples"


def _watch(monkeypatch) -> list:
    said_yes = []
    others = validate.others_refused

    def checked(graph, stages, conns, trial, device, segs, j, local=None):
        said = others(graph, stages, conns, trial, device, segs, j, local)
        if said:
            with Caches("full-check").active():
                found = validate.check_group(graph, stages, conns, trial, device, segs=segs)
                # Another segment's own checks refuse it, or else rule 4 does (or j's own check, which
                # `_check_wave` then does not run after).
                alone = [k for k in range(len(segs)) if k != j and validate.check_group(
                    graph, [s for s in stages if s in segs[k]], conns, [validate.at_kernel_block(trial)[k]],
                    device, segs=[segs[k]])]
            assert found, (stages, trial, j)
            assert alone or {v.rule for v in found} & {"global_sync_wave", "recompute"}, (found, j)
            said_yes.append("others" if alone else "wave")
        return said

    monkeypatch.setattr(tiles, "others_refused", checked)
    return said_yes


@pytest.mark.parametrize(("name", "device"), [("bert_layer", "a100"), ("lstm", "a100"), ("conv_bn_relu", "host")])
def test_others_refused_only_refuses_what_the_check_refuses(name, device, monkeypatch):
    said_yes = _watch(monkeypatch)
    if name == "bert_layer":
        # Every side searched afresh, as before the walk kept a side's tiles (sched4): the multi-segment
        # searches of bert_layer's sides with grid barriers start at illegal tiles.
        stands = build._as_it_stands
        monkeypatch.setattr(build, "_as_it_stands", lambda g, s, c, d, m, kept: stands(g, s, c, d, m, None))
    with Caches("walk").active():
        plan_model(load_graph(SAMPLES / f"{name}.onnx"), "welder", get_device(device))
    if name == "bert_layer":
        assert said_yes.count("others") > 20, said_yes


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(onnx_models(), st.sampled_from(["a100", "v100", "host"]))
def test_others_refused_on_random_graphs(case, device_name):
    model, _, _ = case
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as tmp, Caches("others").active():
        _watch(mp)
        path = Path(tmp) / "m.onnx"
        path.write_bytes(model.SerializeToString())
        try:
            plan_model(load_graph(path), "welder", get_device(device_name))
        except TileweaveError:
            assume(False)
