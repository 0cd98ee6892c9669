"""ONNX model + Plan (+ measured kernel times) → the same ONNX model with our decisions in each node's
metadata_props (kernel, connection levels, modeled and measured µs) and the plan in the model's, so
Netron or Model Explorer show which kernel every operator landed in and why."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from engine.errors import ModelError
from engine.ir.graph import PrimGraph
from engine.schedule.plan import Plan

PREFIX = "tileweave."


def node_annotations(graph: PrimGraph, plan: Plan, measured_us: Mapping[str, float] | None = None
                     ) -> dict[str, dict[str, str]]:
    """ONNX node name -> {key: value} for every node that produced stages of `graph`: the kernel(s)
    holding its stages, the connection levels of the edges leaving them, the modeled (and measured)
    µs of those kernels. Nodes folded into constants at import have no stages and no entry."""
    measured_us = measured_us or {}
    group_at = {s: g for g in plan.groups for s in g.stages}
    conn_of = {e.key: e.conn.value for e in plan.edges}
    stages_of: dict[str, list[str]] = {}
    for s in graph.stages:
        for node in s.origin:
            stages_of.setdefault(node, []).append(s.name)
    out = {}
    for node, stages in stages_of.items():
        kernels = [group_at[s] for s in stages]
        kernels = [g for k, g in enumerate(kernels) if all(g.id != h.id for h in kernels[:k])]
        conns = Counter(conn_of[(s, c)] for s in stages for c in graph.consumers.get(s, ()) if (s, c) in conn_of)
        notes = {
            "kernel": ", ".join(g.name for g in kernels),
            "stages": str(len(stages)),
            "connection": ", ".join(f"{level} ×{n}" for level, n in sorted(conns.items())) or "graph output",
            "kernel_reason": kernels[0].reason,
        }
        modeled = [g.cost.modeled_us for g in kernels if g.cost]
        if modeled:
            notes["kernel_modeled_us"] = f"{sum(modeled):.3f}"
        measured = [measured_us.get(g.name, g.measured_us) for g in kernels]
        if measured and all(m is not None for m in measured):
            notes["kernel_measured_us"] = f"{sum(measured):.3f}"
        out[node] = notes
    return out


def annotate_onnx(model: str | Path | bytes, graph: PrimGraph, plan: Plan,
                  measured_us: Mapping[str, float] | None = None) -> bytes:
    """The serialized ONNX model with `tileweave.*` metadata_props on each node (node_annotations) and
    on the model (policy, device, plan hash, kernels, modeled µs). Node names follow the importer's:
    an unnamed node k is '<OpType>_<k>'. Existing metadata keys of ours are replaced, others kept."""
    import onnx

    try:
        proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))
    except Exception as err:  # onnx raises DecodeError, OSError, ... for a file that is not a model
        raise ModelError(f"cannot read the ONNX model to annotate ({type(err).__name__}: {err})",
                         hint="pass the .onnx file the plan was made from") from None
    notes = node_annotations(graph, plan, measured_us)
    for k, node in enumerate(proto.graph.node):
        found = notes.get(node.name or f"{node.op_type}_{k}")
        if found:
            _set_props(node.metadata_props, found)
    _set_props(proto.metadata_props, {
        "policy": plan.policy, "base_policy": plan.base_policy or plan.policy, "device": plan.device,
        "plan_hash": plan.plan_hash, "kernels": str(plan.kernels), "modeled_us": f"{plan.modeled_us:.3f}",
        "edits": str(len(plan.edits)),
    } | ({"measured_us": f"{sum(measured_us.values()):.3f}"} if measured_us else {}))
    return proto.SerializeToString()


def _set_props(props, values: Mapping[str, str]) -> None:
    keep = [(p.key, p.value) for p in props if not p.key.startswith(PREFIX)]
    del props[:]
    for key, value in keep + [(PREFIX + k, v) for k, v in values.items()]:
        entry = props.add()
        entry.key, entry.value = key, value
