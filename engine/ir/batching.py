"""Operator batching (Wolong): contractions that compute the same expression of the same input with
different constant weights (Q/K/V projections, LSTM gate GEMMs) become one contraction over the weights
concatenated along the output's last axis; each original tensor becomes a slice of the batched one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.graph import PrimGraph, Stage, StageKind, TensorSpec
from engine.ir.passes import inline_views, remove_dead

_W = "__batched_weight__"  # placeholder tensor name: members agree on the body up to their weight


@dataclass(frozen=True)
class BatchDecision:
    """Why a set of contractions was (or was not) batched; `batched` names the new stage."""

    stages: tuple[str, ...]
    batched: str | None
    reason: str

    def __str__(self) -> str:
        verdict = f"batched into {self.batched}" if self.batched else "not batched"
        return f"{', '.join(self.stages)}: {verdict} ({self.reason})"


@dataclass(frozen=True)
class _Match:
    stage: Stage
    weight: str
    axis: int  # weight axis indexed by the stage's last output axis
    key: tuple  # members with equal keys batch together


def batch_contractions(graph: PrimGraph, *, inline: bool = True) -> tuple[PrimGraph, tuple[BatchDecision, ...]]:
    """The graph with batchable contractions merged, and one decision per candidate set.

    Legal when every member is a contraction whose body, apart from one constant weight loaded with the
    last output axis as a plain index, is identical (same input, same indexing, same reduction), and the
    weights agree in dtype and in every other axis. With `inline`, the slices fold into consumers."""
    matches: dict[tuple, list[_Match]] = {}
    decisions: list[BatchDecision] = []
    refused: dict[str, list[tuple[str, str]]] = {}  # shared input -> (stage, why) for the decision log
    for s in graph.stages:
        if s.kind != StageKind.CONTRACTION:
            continue
        m, why = _match(graph, s)
        if m is None:
            for t in s.inputs:
                refused.setdefault(t, []).append((s.name, why))
            continue
        matches.setdefault(m.key, []).append(m)
    sets = [ms for ms in matches.values() if len(ms) > 1]
    for ms in matches.values():
        if len(ms) == 1:
            for t in ms[0].stage.inputs:
                refused.setdefault(t, []).append((ms[0].stage.name, "no other contraction computes the same "
                                                  "expression of this input with a weight of the same shape"))
    shared_inputs = {t for s in graph.stages if s.kind == StageKind.CONTRACTION for t in s.inputs
                     if not _is_const(graph, t) and len([c for c in graph.consumers.get(t, ())
                                                         if graph.stage(c).kind == StageKind.CONTRACTION]) > 1}
    for t in sorted(shared_inputs):
        for name, why in refused.get(t, []):
            decisions.append(BatchDecision((name,), None, f"reads {t} like other contractions, but {why}"))
    if not sets:
        return graph, tuple(decisions)

    weights = dict(graph.weights)
    constants = list(graph.constants)
    replace: dict[str, list[Stage]] = {}
    for ms in sets:
        first = ms[0].stage
        name = f"{first.name}.batched"
        wname = f"{name}.weight"
        axis = ms[0].axis
        weights[wname] = np.ascontiguousarray(np.concatenate([graph.weights[m.weight] for m in ms], axis=axis))
        constants.append(TensorSpec(wname, weights[wname].shape, graph.specs[ms[0].weight].dtype))
        sizes = [m.stage.shape[-1] for m in ms]
        batched = Stage(
            name, StageKind.CONTRACTION, first.shape[:-1] + (sum(sizes),), first.dtype,
            _rename(first.body, ms[0].weight, wname), first.reduce, first.combine, first.op,
            tuple(dict.fromkeys(o for m in ms for o in m.stage.origin)),
        )
        offsets = np.cumsum([0, *sizes[:-1]])
        slices = [_slice(m.stage, name, int(off)) for m, off in zip(ms, offsets)]
        replace[first.name] = [batched, slices[0]]
        for m, sl in zip(ms[1:], slices[1:]):
            replace[m.stage.name] = [sl]
        decisions.append(BatchDecision(
            tuple(m.stage.name for m in ms), name,
            f"same input and body, constant weights {[tuple(graph.specs[m.weight].shape) for m in ms]} "
            f"concatenated on axis {axis} into {wname} {tuple(weights[wname].shape)}: one "
            f"{list(batched.shape)} contraction instead of {len(ms)}"))
    stages = tuple(x for s in graph.stages for x in replace.get(s.name, [s]))
    out = remove_dead(dataclasses.replace(graph, stages=stages, constants=tuple(constants), weights=weights))
    return (inline_views(out) if inline else out), tuple(decisions)


def _is_const(graph: PrimGraph, name: str) -> bool:
    return name in graph.weights


def _match(graph: PrimGraph, s: Stage) -> tuple[_Match | None, str]:
    """The batching key of a contraction, or None and the rule it breaks."""
    last = f"i{len(s.shape) - 1}"
    if not s.shape:
        return None, "its output is a scalar"
    weight_loads = [n for n in E.walk(s.body) if isinstance(n, E.Load) and _is_const(graph, n.tensor)
                    and any(last in ix.vars() for ix in n.index)]
    if len({n.tensor for n in weight_loads}) != 1:
        return None, "it reads no constant weight indexed by its last output axis" if not weight_loads else \
            "several constant tensors vary along its last output axis"
    w = weight_loads[0]
    if w.pad is not None:
        return None, f"its weight {w.tensor} is read with padding"
    axes = [k for k, ix in enumerate(w.index) if last in ix.vars()]
    if len(axes) != 1 or w.index[axes[0]] != I.var(last):
        return None, f"its weight {w.tensor} is not indexed by the last output axis alone on one axis"
    axis = axes[0]
    wshape = graph.specs[w.tensor].shape
    if wshape[axis] != s.shape[-1]:
        return None, f"its weight {w.tensor} is larger than the output along the batched axis"
    others = [n for n in E.walk(s.body) if n is not w and n != w]
    for n in others:
        idx = n.index if isinstance(n, E.Load) else (n.expr,) if isinstance(n, E.IndexVal) else ()
        if any(last in ix.vars() for ix in idx):
            return None, "an operand other than the weight varies along the last output axis"
    body = _rename(s.body, w.tensor, _W)
    key = (body, s.shape[:-1], s.reduce, s.combine, s.dtype, graph.specs[w.tensor].dtype,
           wshape[:axis] + wshape[axis + 1:], axis)
    return _Match(s, w.tensor, axis, key), ""


def _rename(body: E.Expr, old: str, new: str) -> E.Expr:
    def fn(node: E.Expr) -> E.Expr:
        if isinstance(node, E.Load) and node.tensor == old:
            return E.Load(new, node.index, node.dtype, node.pad)
        return node

    return E.map_expr(body, fn)


def _slice(orig: Stage, batched: str, offset: int) -> Stage:
    """The original tensor as a view of the batched one: its last axis shifted by `offset`."""
    index = list(I.out_vars(len(orig.shape)))
    index[-1] = index[-1] + offset
    return Stage(orig.name, StageKind.LAYOUT, orig.shape, orig.dtype, E.Load(batched, tuple(index), orig.dtype),
                 op="slice", origin=orig.origin)
