"""Repeated layers of a PrimGraph: stages grouped by the ONNX scope they came from, scopes with the
same structure matched position by position (for collapsing in the tile-graph and for "apply to all
identical layers" in the plan editor)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.ir.graph import PrimGraph, Stage


@dataclass(frozen=True)
class Layer:
    scope: str
    stages: tuple[str, ...]  # stage order
    signature: str  # equal signatures = structurally identical layers


def stage_scope(stage: Stage) -> str:
    """'encoder.layer.3' for a stage from ONNX node 'encoder.layer.3/MatMul_9'; '' at top level."""
    source = stage.origin[0] if stage.origin else stage.name
    return source.rsplit("/", 1)[0] if "/" in source else ""


def find_layers(graph: PrimGraph) -> list[Layer]:
    """Scopes in order of first stage; the top level ('') is never treated as a layer."""
    members: dict[str, list[str]] = {}
    for s in graph.stages:
        members.setdefault(stage_scope(s), []).append(s.name)
    layers = []
    for scope, names in members.items():
        if scope:
            layers.append(Layer(scope, tuple(names), _signature(graph, names)))
    return layers


def _signature(graph: PrimGraph, names: list[str]) -> str:
    # Ops, shapes and the internal wiring by position: two layers match only if every stage does.
    pos = {n: k for k, n in enumerate(names)}
    parts = []
    for n in names:
        s = graph.stage(n)
        wiring = tuple(pos.get(t, -1) for t in s.inputs)
        parts.append(f"{s.kind.value}:{s.op}:{s.shape}:{s.reduce}:{wiring}")
    return "|".join(parts)


def repeated_layers(graph: PrimGraph) -> dict[str, list[Layer]]:
    """First layer's scope -> the later layers identical to it (only signatures seen twice)."""
    first: dict[str, Layer] = {}
    repeats: dict[str, list[Layer]] = {}
    for layer in find_layers(graph):
        if layer.signature in first:
            repeats.setdefault(first[layer.signature].scope, []).append(layer)
        else:
            first[layer.signature] = layer
    return repeats


def matching_edges(graph: PrimGraph, producer: str, consumer: str) -> list[tuple[str, str]]:
    """The same edge in every structurally identical layer (the edge itself first). An edge that
    leaves its layer, or lies outside any layer, matches only itself."""
    scope = stage_scope(graph.stage(producer))
    if not scope or stage_scope(graph.stage(consumer)) != scope:
        return [(producer, consumer)]
    layers = find_layers(graph)
    own = next(lay for lay in layers if lay.scope == scope)
    ip, ic = own.stages.index(producer), own.stages.index(consumer)
    out = [(producer, consumer)]
    for lay in layers:
        if lay.signature == own.signature and lay.scope != scope:
            out.append((lay.stages[ip], lay.stages[ic]))
    return out
