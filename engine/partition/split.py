"""Tensor parallelism as a graph rewrite: one contraction with a constant weight in, N contractions over
column slices of that weight (one per device) and a concat stage under the original name out, so the
executed program runs exactly what the partitioner modeled."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from engine.errors import PlanError
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import PrimGraph, Stage, StageKind, TensorSpec
from engine.ir.passes import remove_dead

SLICE_TAG = ".tp"  # slice j of stage S is named S.tp{j}; its weight S.tp{j}.weight


@dataclass(frozen=True)
class SplitAxis:
    """Where a contraction can be cut: output axis `axis` indexes weight axis `weight_axis` alone."""

    stage: str
    weight: str
    axis: int
    weight_axis: int
    weight_bytes: int


def split_axis(graph: PrimGraph, stage: Stage) -> SplitAxis | None:
    """The output axis to cut `stage` along (the last that qualifies: MatMul/Gemm columns, conv output
    channels), or None: it must read exactly one constant that varies along that axis, indexed by the
    axis alone, and nothing else may vary along it."""
    if stage.kind != StageKind.CONTRACTION or not stage.shape:
        return None
    for axis in reversed(range(len(stage.shape))):
        var = f"i{axis}"
        nodes = list(E.walk(stage.body))
        varying = [n for n in nodes if isinstance(n, E.Load) and any(var in ix.vars() for ix in n.index)]
        if any(isinstance(n, E.IndexVal) and var in n.expr.vars() for n in nodes):
            continue
        if len({n.tensor for n in varying}) != 1 or varying[0].tensor not in graph.weights:
            continue
        w = varying[0]
        axes = [k for k, ix in enumerate(w.index) if var in ix.vars()]
        shape = graph.specs[w.tensor].shape
        if w.pad is None and len(axes) == 1 and w.index[axes[0]] == I.var(var) and shape[axes[0]] == stage.shape[axis]:
            return SplitAxis(stage.name, w.tensor, axis, axes[0], graph.specs[w.tensor].nbytes)
    return None


def slice_names(stage: str, parts: int) -> tuple[str, ...]:
    return tuple(f"{stage}{SLICE_TAG}{j}" for j in range(parts))


def split_contraction(graph: PrimGraph, cut: SplitAxis, parts: int) -> PrimGraph:
    """`graph` with contraction `cut.stage` computed as `parts` slices along `cut.axis` (slice j reads
    only its columns of the weight) and a concat stage of the same name gathering them."""
    stage = graph.stage(cut.stage)
    extent = stage.shape[cut.axis]
    if extent < parts:
        raise PlanError(f"cannot split '{stage.name}' {parts} ways: its axis {cut.axis} has only {extent} entries")
    bounds = [extent * j // parts for j in range(parts + 1)]
    weights, constants = dict(graph.weights), list(graph.constants)
    dtype = graph.specs[cut.weight].dtype
    slices: list[Stage] = []
    for j, name in enumerate(slice_names(stage.name, parts)):
        lo, hi = bounds[j], bounds[j + 1]
        wname = f"{name}.weight"
        take = [slice(None)] * len(graph.specs[cut.weight].shape)
        take[cut.weight_axis] = slice(lo, hi)
        weights[wname] = np.ascontiguousarray(graph.weights[cut.weight][tuple(take)])
        constants.append(TensorSpec(wname, weights[wname].shape, dtype))
        shape = stage.shape[:cut.axis] + (hi - lo,) + stage.shape[cut.axis + 1:]
        body = E.map_expr(stage.body, lambda n, w=wname: E.Load(w, n.index, n.dtype, n.pad)
                          if isinstance(n, E.Load) and n.tensor == cut.weight else n)
        slices.append(Stage(name, StageKind.CONTRACTION, shape, stage.dtype, body, stage.reduce, stage.combine,
                            stage.op, stage.origin))
    concat = Stage(stage.name, StageKind.LAYOUT, stage.shape, stage.dtype,
                   _concat_body(slices, bounds, cut.axis, stage), op="concat", origin=stage.origin)
    stages = tuple(x for s in graph.stages for x in ((*slices, concat) if s.name == stage.name else (s,)))
    return remove_dead(dataclasses.replace(graph, stages=stages, constants=tuple(constants), weights=weights))


def _concat_body(slices: list[Stage], bounds: list[int], axis: int, stage: Stage) -> E.Expr:
    """out[.., i, ..] = slice_j[.., i - lo_j, ..] for the j whose [lo_j, hi_j) holds i (as ONNX Concat)."""
    ivars = I.out_vars(len(stage.shape))
    zero = False if stage.dtype == DType.BOOL else (0.0 if stage.dtype.is_float else 0)
    body: E.Expr | None = None
    for j in reversed(range(len(slices))):
        index = tuple(v - bounds[j] if d == axis else v for d, v in enumerate(ivars))
        load = E.Load(slices[j].name, index, stage.dtype, zero)
        if body is None:
            body = load
        else:
            below = E.binary("lt", E.index_val(ivars[axis]), E.imm(bounds[j + 1], DType.I64))
            body = E.select(below, load, body)
    assert body is not None
    return body
