"""engine/partition/plan.py: pipeline stages under memory budgets, tensor-parallel splits, transfers,
the event-simulated makespan and the --json schema."""

from __future__ import annotations

import numpy as np
import pytest
from mlp import write_mlp, write_small_device
from support import sample_path

from engine.device import get_device
from engine.errors import PartitionError
from engine.frontend.importer import load_graph
from engine.partition.links import LINKS
from engine.partition.plan import kernel_facts, partition_model, split_plan, tp_candidates
from engine.runtime.reference import run_reference
from engine.schedule.pipeline import plan_model


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mlp")
    path, inputs = write_mlp(folder)
    device = get_device(write_small_device(folder))
    graph, plan = plan_model(load_graph(path, {}), "welder", device)
    return graph, plan, device, inputs


@pytest.fixture(scope="module")
def bert():
    graph, plan = plan_model(load_graph(sample_path("bert_layer"), {}), "welder", "a100")
    return graph, plan


def test_two_devices_beat_one_when_the_weights_do_not_fit(mlp):
    graph, plan, device, _ = mlp
    assert graph.param_bytes > device.memory_bytes  # the model cannot live on one device
    g2, p2, part = partition_model(graph, plan, device, 2, "nvlink")
    assert not part.single_device_fits
    assert part.tensor_parallel  # a weight over half a device is split over both
    assert part.makespan_us < part.single_device_us
    assert all(s.peak_bytes <= device.memory_bytes for s in part.stages)
    assert {k.device for k in part.kernels if k.tensor_parallel} == {0, 1}


def test_pipeline_alone_cannot_fit_and_says_why(mlp):
    graph, plan, device, _ = mlp
    with pytest.raises(PartitionError, match="fits 10,000,000 B per device"):
        partition_model(graph, plan, device.__class__.from_dict(device.to_dict() | {"memory_bytes": 10_000_000}),
                        2, "nvlink")


def test_split_graph_computes_the_same_outputs(mlp):
    graph, plan, device, inputs = mlp
    g2, _, part = partition_model(graph, plan, device, 2, "nvlink")
    assert g2.structural_hash != graph.structural_hash
    want, got = run_reference(graph, inputs), run_reference(g2, inputs)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)


def test_transfers_are_the_tensors_read_across_devices(bert):
    graph, plan = bert
    g2, p2, part = partition_model(graph, plan, "a100", 2, "pcie")
    facts = {k.name: k for k in kernel_facts(g2, p2)}
    where = {k.kernel: k.device for k in part.kernels}
    made = {t: where[k.name] for k in facts.values() for t in k.writes} | {t.name: 0 for t in g2.inputs}
    want = {(t, made[t], where[k.name]) for k in facts.values() for t in k.reads if made[t] != where[k.name]}
    assert {(t.tensor, t.src, t.dst) for t in part.transfers} == want
    link = LINKS["pcie"]
    for t in part.transfers:
        assert t.bytes == g2.specs[t.tensor].nbytes
        assert t.us == pytest.approx(link.latency_s * 1e6 + t.bytes / link.bandwidth_bytes_per_s * 1e6)
        assert t.end_us - t.start_us == pytest.approx(t.us)
    # one request: kernels on one device never overlap, and a kernel starts after its inputs arrive
    for d in range(2):
        slots = [k for k in part.kernels if k.device == d]
        assert all(a.end_us <= b.start_us + 1e-9 for a, b in zip(slots, slots[1:]))
    arrive = {(t.tensor, t.dst): t.end_us for t in part.transfers}
    for k in part.kernels:
        for t in facts[k.kernel].reads:
            assert k.start_us >= arrive.get((t, k.device), 0.0) - 1e-9
    assert part.makespan_us >= max(k.end_us for k in part.kernels)
    for d in range(2):  # a device runs its kernels one at a time: its busy time bounds the makespan
        assert part.makespan_us >= sum(k.end_us - k.start_us for k in part.kernels if k.device == d) - 1e-9


def test_a_split_keeps_the_plan_it_splits(bert):
    """The tensor-parallel plan is the given plan (the user's edits included) with the slices cut out:
    kernels that hold no split stage keep their tiles, other connections hold; only the kernels the
    split breaks up are searched again (re-planning the split graph took 9-18 s on bert and vit), and a
    kernel fused around the slice (the welder walk's attention kernel on bert_layer a100) is broken up."""
    from engine.schedule.edits import apply_edit
    from engine.schedule.plan import Conn, Edit

    graph, plan = bert
    device = get_device("a100")
    name = tp_candidates(graph, plan, device, 2)[2][0]  # the largest weight
    inner = next(e for g in plan.groups if name not in g.stages for e in plan.edges
                 if e.conn.fused and e.producer in g.stages and e.consumer in g.stages)
    plan = apply_edit(plan, graph, device, Edit.make("split", producer=inner.producer, consumer=inner.consumer))
    g2, p2, pinned = split_plan(graph, plan, device, [name], 2)
    assert sorted(pinned.values()) == [0, 1] and all(p2.group_of(s).stages == (s,) for s in pinned)
    assert p2.edge(inner.producer, inner.consumer).conn == Conn.KERNEL  # the user's edit holds
    after = {g.stages: g for g in p2.groups}
    untouched = [g for g in plan.groups if name not in g.stages]
    assert untouched and all(after[g.stages].segments == g.segments for g in untouched)
    broken = 0
    for e in plan.edges:
        if g2.is_stage(e.producer) and (e.producer, e.consumer) in set(g2.edges):
            now = p2.edge(e.producer, e.consumer)
            # A kernel holding stages on both sides of the slice is broken up (a cycle once it is cut out).
            assert now.conn == e.conn or (now.conn == Conn.KERNEL and now.source == "partition"), (e, now)
            broken += now.conn != e.conn
    assert broken < len(plan.edges) / 2
    assert p2.edits[:len(plan.edits)] == plan.edits


def test_json_schema(bert):
    graph, plan = bert
    js = partition_model(graph, plan, "a100", 2, "nvlink")[2].to_json()
    assert isinstance(js["devices"], int) and js["devices"] == 2
    assert [s["device"] for s in js["stages"]] == [0, 1]
    for s in js["stages"]:
        assert set(s) >= {"device", "kernels", "peak_bytes"} and s["kernels"] and isinstance(s["peak_bytes"], int)
    for t in js["transfers"]:
        assert set(t) >= {"tensor", "src", "dst", "bytes", "us"} and t["src"] != t["dst"]
    assert isinstance(js["makespan_us"], float) and isinstance(js["single_device_us"], float)
    kernels = [k for s in js["stages"] for k in s["kernels"]]
    assert sorted(kernels) == sorted(k["kernel"] for k in js["kernels"])


def test_too_few_kernels_and_bad_device_count(bert):
    # No contraction to split (bert_layer's welder plan has 4 kernels, but its splits make more).
    small, one = plan_model(load_graph(sample_path("layernorm_residual"), {}), "welder", "a100")
    n = one.kernels + 1
    with pytest.raises(PartitionError, match=f"fewer than --devices {n}"):
        partition_model(small, one, "a100", n, "pcie")
    graph, plan = bert
    with pytest.raises(PartitionError, match="from 1 to 64"):
        partition_model(graph, plan, "a100", 0, "pcie")
