"""The tile search's cheaper paths (sched2 branch) answer as the full ones do:
- `validate.refused_early` only refuses what `check_group` refuses (every time it says yes in a whole
  welder walk, over sample models and random graphs), and it does refuse some;
- the regions memo shares REGISTER and SHARED edges (propagation cannot tell them apart) but not a
  kernel or global_sync edge inside the segment;
- `floor_us` with one search's memo reused across candidates equals it computed afresh;
- a group signature built from per-body templates equals the direct text, and a changed body misses."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest
from fuzz_graphs import onnx_models
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sched_graphs import candidate_trials

from engine.device import get_device
from engine.errors import TileweaveError
from engine.frontend.importer import load_graph
from engine.ir import expr as E
from engine.memo import Caches
from engine.schedule import cost, tiles, validate
from engine.schedule.floor import floor_us
from engine.schedule.pipeline import plan_model
from engine.schedule.plan import Conn
from engine.tilegraph.tilegraph import propagate_group, segments_of

SAMPLES = Path(__file__).resolve().parents[3] / "samples"


def _watch_refusals(monkeypatch) -> list:
    """Wrap the search's early refusal: each time it refuses, the full check must find a violation."""
    early = validate.refused_early
    seen = []

    def checked(graph, stages, conns, trial, device, segs, j, local=None):
        said = early(graph, stages, conns, trial, device, segs, j, local)
        if said:
            with Caches("full-check").active():  # the check on tables of its own, nothing shared
                found = validate.check_group(graph, stages, conns, trial, device, segs=segs)
            assert found, (stages, trial)
            seen.append(found[0].rule)
        return said

    monkeypatch.setattr(tiles, "refused_early", checked)
    return seen


_SLOW = pytest.mark.slow  # a full check per refusal: bert_layer on a100 takes ~80 s under load


@pytest.mark.parametrize(("name", "device"), [
    ("bert_layer", "v100"), ("masked_softmax", "a100"), ("conv_bn_relu", "host"), ("lstm", "a100"),
    pytest.param("bert_layer", "a100", marks=_SLOW), pytest.param("bert_layer", "host", marks=_SLOW),
    pytest.param("mobilenetv2_block", "a100", marks=_SLOW), pytest.param("zoo/decoder_kv", "a100", marks=_SLOW),
])
def test_early_refusal_only_refuses_what_the_check_refuses(name, device, monkeypatch):
    seen = _watch_refusals(monkeypatch)
    with Caches("walk").active():
        plan_model(load_graph(SAMPLES / f"{name}.onnx"), "welder", get_device(device))
    if name == "bert_layer" and device != "host":
        assert len(seen) > 20 and {"recompute", "global_sync_wave"} & set(seen), seen  # not vacuous


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(onnx_models(), st.sampled_from(["a100", "v100", "host"]), st.sampled_from(["welder", "stitch"]))
def test_early_refusal_on_random_graphs(case, device_name, policy):
    model, _, _ = case
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as tmp, Caches("early").active():
        _watch_refusals(mp)
        path = Path(tmp) / "m.onnx"
        path.write_bytes(model.SerializeToString())
        try:
            plan_model(load_graph(path), policy, get_device(device_name))
        except TileweaveError:
            assume(False)


def test_early_refusal_memo_keys_on_the_recompute_bound():
    """Rule 9's verdict is kept per search under the bound in force: a looser bound must not reuse it."""
    dev = get_device("a100")
    graph = load_graph(SAMPLES / "bert_layer.onnx")
    _, plan = plan_model(graph, "welder", dev)
    conns = {e.key: e.conn for e in plan.edges}
    for group, segs, seg, _, trial in candidate_trials(graph, plan, dev):
        j = segs.index(seg)
        local: dict = {}
        with validate.bounded({"recompute_bound": 1.0}):
            tight = validate.refused_early(graph, group.stages, conns, trial, dev, segs, j, local)
        with validate.bounded({"recompute_bound": 1e9}):
            loose = validate.refused_early(graph, group.stages, conns, trial, dev, segs, j, local)
            fresh = validate.refused_early(graph, group.stages, conns, trial, dev, segs, j, {})
        assert loose == fresh
        if tight and not loose:
            return
    pytest.fail("no candidate refused at bound 1 and accepted at a loose bound: the test checks nothing")


def test_regions_memo_shares_register_and_shared_only(attn_graph):
    graph = attn_graph
    names = [s.name for s in graph.stages]
    inner = [(p, c) for p in names for c in graph.consumers.get(p, ()) if c in names]
    anchor = names[-1]
    box = tuple((0, min(4, d)) for d in graph.stage(anchor).shape)
    with Caches("regions").active():
        got = {}
        for level in (Conn.REGISTER, Conn.SHARED, Conn.KERNEL, Conn.GLOBAL_SYNC):
            conns = {e: level for e in inner}
            got[level] = cost._regions(graph, names, conns, anchor, box)
            assert got[level] == propagate_group(graph, names, conns, anchor, box), level
    assert got[Conn.REGISTER] == got[Conn.SHARED]
    assert got[Conn.KERNEL] != got[Conn.REGISTER]  # a cut edge: its producer's region is an input's now


@pytest.mark.parametrize("device", ["a100", "host"])
def test_floor_with_a_search_memo_equals_it_afresh(device):
    dev = get_device(device)
    graph, plan = plan_model(load_graph(SAMPLES / "bert_layer.onnx"), "welder", dev)
    conns = {e.key: e.conn for e in plan.edges}
    locals_: dict = {}
    checked = 0
    for group, segs, _, _, trial in candidate_trials(graph, plan, dev):
        local = locals_.setdefault(group.name, {})  # one memo per group, as one search keeps it
        assert floor_us(graph, group.stages, conns, trial, dev, segs, local) == floor_us(
            graph, group.stages, conns, trial, dev, segs), (group.name, trial)
        checked += 1
    assert checked > 50


def _direct_signature(graph, stages, conns) -> str:
    """`tiles._group_signature` as it was written before the body templates."""
    import hashlib

    names = {s: f"s{j}" for j, s in enumerate(stages)}
    members = set(stages)
    parts = []
    for s in stages:
        stage = graph.stage(s)
        for t in stage.inputs:
            if t not in names:
                spec = graph.specs[t]
                names[t] = f"x{len(names)}"
                parts.append(f"{names[t]}:{spec.shape}:{spec.dtype.value}")
        outside = s in graph.outputs or any(c not in members for c in graph.consumers.get(s, ()))
        parts.append(f"{names[s]}|{stage.kind.value}|{stage.shape}|{stage.dtype.value}|{stage.reduce}|"
                     f"{stage.combine}|{outside}|{tiles._canon(stage.body, names)}")
    for p in stages:
        for c in graph.consumers.get(p, ()):
            if c in members:
                parts.append(f"{names[p]}>{names[c]}={conns.get((p, c), 'kernel')}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


@pytest.mark.parametrize("name", ["bert_layer", "vit_block", "zoo/decoder_kv", "lstm"])
def test_group_signature_from_templates_equals_the_direct_text(name):
    graph, plan = plan_model(load_graph(SAMPLES / f"{name}.onnx"), "welder", get_device("a100"))
    conns = {e.key: e.conn for e in plan.edges}
    for group in plan.groups:
        for seg in segments_of(graph, group.stages, conns) + [list(group.stages)]:
            assert tiles._group_signature(graph, seg, conns) == _direct_signature(graph, seg, conns)


def test_body_template_misses_for_a_changed_body(attn_graph):
    stage = next(s for s in attn_graph.stages if s.body is not None and isinstance(s.body, E.Binary))
    other = dataclasses.replace(stage, body=E.Binary("add", stage.body.b, stage.body.a, stage.body.dtype)
                                if stage.body.op != "add" else E.Binary("mul", stage.body.a, stage.body.b, stage.body.dtype))
    with Caches("templates").active():
        first = tiles._body_template(stage)
        assert tiles._body_template(other) != first
        assert tiles._body_template(stage) == first


@pytest.mark.parametrize("policy", ["unfused", "welder"])
def test_alike_segments_share_one_count_and_keep_their_names(policy, monkeypatch):
    """Segments of one structure (a repeated layer's) build and count one kernel per tile: the second is served
    from the first's entry renamed (`cost._alike_segment_use`), equal to its own count field by field."""
    device = get_device("host")
    with Caches("alike-plan").active():
        graph, plan = plan_model(load_graph(SAMPLES / "zoo" / "bert.onnx"), policy, device)
    conns = {e.key: e.conn for e in plan.edges}
    work = [(seg, tile) for g in plan.groups for seg, tile in zip(segments_of(graph, g.stages, conns), g.segments)]
    counted = []
    inner = cost._segment_use

    def watched(graph, segment, *a, **k):
        counted.append(tuple(segment))
        return inner(graph, segment, *a, **k)

    monkeypatch.setattr(cost, "_segment_use", watched)
    with Caches("alike").active():
        got = [cost.segment_use(graph, seg, conns, tile, device=device) for seg, tile in work]
    monkeypatch.setattr(cost, "_segment_use", inner)
    for (seg, tile), use in zip(work, got):
        assert use == inner(graph, seg, conns, tile, set(seg), False, device), seg
        assert use.stages == tuple(seg) and use.tile == tile
    if policy == "unfused":  # the second layer's stages are the first's
        assert len(counted) < len(work) * 3 // 4, (len(counted), len(work))


def _chain_model(big: int) -> Path:
    """x[64, 256] -> Relu -> Exp, and beside it (when `big`) an unrelated Neg over `big` floats: the chain's
    groups sign alike in both models, while only the first fits a host's last-level cache whole."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="r"), helper.make_node("Exp", ["r"], ["out"], name="e")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [64, 256])]
    if big:
        nodes.append(helper.make_node("Neg", ["y"], ["z"], name="n"))
        inputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [big]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [big]))
    model = helper.make_model(helper.make_graph(nodes, f"chain{big}", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = Path(tempfile.mkdtemp()) / f"chain{big}.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_search_answers_are_kept_apart_where_the_model_fits_the_llc_and_where_not():
    """A group's host cost reads whether the whole model fits the last-level cache (`cost._in_llc`), which its
    signature cannot see: a model planned after another with a group of the same structure gets the plan it
    gets alone (the search cache keyed on the signature alone served swin's answers to mobilevit)."""
    dev = get_device("host")
    small, big = load_graph(_chain_model(0)), load_graph(_chain_model(dev.l2_bytes // 4 + 1))
    assert cost._in_llc(small, dev) and not cost._in_llc(big, dev)
    costs = {}
    for order in (("small", "big"), ("big", "small")):
        with Caches("order").active():
            for name in order:
                _, plan = plan_model({"small": small, "big": big}[name], "unfused", dev)
                costs.setdefault(name, set()).add(next(g.cost.modeled_us for g in plan.groups if "r" in g.stages))
    assert len(costs["small"]) == len(costs["big"]) == 1, costs  # the same plan whichever came first
    assert costs["small"] != costs["big"]  # and the two do cost differently (not vacuous)
