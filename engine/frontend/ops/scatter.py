"""Scatters (ScatterElements, its older name Scatter, ScatterND) as gathers: each output element finds the
updates that land on it by a reduction over the positions that could (ScatterElements: the indices' extent
along the axis; ScatterND: every update row) — the last match's position for reduction="none" (duplicates
are undefined in ONNX; onnxruntime applies them in order, so the last wins), else the updates combined — and
reads it or keeps the data's element. No write is racy and every value is computed once; the match costs
the positions searched per element, fine for the short axes and few rows models scatter (a KV cache's new
token, a mask's positions), quadratic where a whole axis is scattered."""

from __future__ import annotations

import math

import numpy as np

from engine.frontend.context import LowerCtx, OnnxNode, register, zero_of
from engine.frontend.ops.layout import reshape_to
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine, StageKind

_COMBINE = {"add": Combine.SUM, "mul": Combine.PROD, "max": Combine.MAX, "min": Combine.MIN}
_APPLY = {"add": "add", "mul": "mul", "max": "max", "min": "min"}


def _reduction(ctx: LowerCtx, node: OnnxNode) -> str:
    mode = ctx.attr(node, "reduction", "none")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("none", *_COMBINE):
        raise ctx.unsupported(f"reduction={mode!r} (none, add, mul, max or min)")
    return mode


def _identity(mode: str, dtype: DType) -> E.Expr:
    """The value a combine of no updates leaves the data with (0 for add, 1 for mul, the dtype's extreme for
    max and min)."""
    if mode in ("add", "mul"):
        return E.imm(0 if mode == "add" else 1, dtype) if not dtype.is_float else E.imm(float(mode == "mul"), dtype)
    if dtype.is_float:
        return E.imm(-math.inf if mode == "max" else math.inf, dtype)
    info = np.iinfo(dtype.np)
    return E.imm(int(info.min if mode == "max" else info.max), dtype)


def _lands(ctx: LowerCtx, idx: str, at: tuple[I.Lin, ...], target: I.Lin, size: int, outside: int) -> E.Expr:
    """Whether the index stored in `idx` at `at` names position `target` of an axis of `size` (negative indices
    count from its end); where `at` lies outside the indices (`outside`: a value no position matches) it never
    does."""
    value = ctx.load(idx, at, pad=outside)
    if value.dtype != DType.I64:
        value = E.cast(value, DType.I64)
    here = E.index_val(target)
    return E.binary("or", E.binary("eq", value, here), E.binary("eq", value, E.index_val(target - size)))


def _combine_into(ctx: LowerCtx, out: str, data: str, shape, mode: str, found: str, op: str) -> None:
    ivars = I.out_vars(len(shape))
    ctx.elementwise(out, tuple(shape), ctx.dtype(data),
                    E.binary(_APPLY[mode], ctx.load(data, ivars), ctx.load(found, ivars)), op=op)


@register("ScatterElements", "Scatter")
def convert_scatter_elements(ctx: LowerCtx, node: OnnxNode) -> None:
    data, idx, upd = node.inputs[:3]
    dshape, ishape = ctx.shape(data), ctx.shape(idx)
    rank = len(dshape)
    axis = ctx.axis(node, rank, 0)
    if len(ishape) != rank or ctx.shape(upd) != ishape or any(
            i > n for d, (i, n) in enumerate(zip(ishape, dshape)) if d != axis):
        raise ctx.unsupported(f"indices {list(ishape)} and updates {list(ctx.shape(upd))} into data "
                              f"{list(dshape)} (the same rank, equal shapes, no larger than the data off the axis)")
    mode = _reduction(ctx, node) if ctx.opset >= 16 else "none"
    out = node.outputs[0]
    ivars = I.out_vars(rank)
    r = I.var("r0")
    at = tuple(r if d == axis else v for d, v in enumerate(ivars))
    lands = _lands(ctx, idx, at, ivars[axis], dshape[axis], dshape[axis])
    dt = ctx.dtype(data)
    if ishape[axis] == 0:
        ctx.elementwise(out, dshape, dt, ctx.load(data, ivars), op="scatter")
        return
    if mode == "none":
        hit = ctx.emit(ctx.tmp(out, "hit"), dshape, DType.I64,
                       E.select(lands, E.index_val(r), E.imm(-1, DType.I64)), kind=StageKind.REDUCE,
                       op="scatter.match", reduce=(ishape[axis],), combine=Combine.MAX)
        sel = I.as_lin(I.Indirect(ctx.resolve(hit), tuple(ivars), ishape[axis]))
        update = ctx.load(upd, tuple(sel if d == axis else v for d, v in enumerate(ivars)), pad=zero_of(dt))
        found = E.binary("ge", ctx.load(hit, ivars), E.imm(0, DType.I64))
        ctx.elementwise(out, dshape, dt, E.select(found, update, ctx.load(data, ivars)), op="scatter")
        return
    found = ctx.emit(ctx.tmp(out, mode), dshape, dt, E.select(lands, ctx.load(upd, at, pad=zero_of(dt)),
                                                               _identity(mode, dt)),
                     kind=StageKind.REDUCE, op=f"scatter.{mode}", reduce=(ishape[axis],), combine=_COMBINE[mode])
    _combine_into(ctx, out, data, dshape, mode, found, "scatter")


@register("ScatterND")
def convert_scatter_nd(ctx: LowerCtx, node: OnnxNode) -> None:
    """out = data with out[idx[u]] = updates[u] for each row u of the indices (rows of k leading coordinates):
    the rows flattened to one axis, an output element matches row u where all k coordinates name it."""
    data, idx, upd = node.inputs[:3]
    dshape, ishape, ushape = ctx.shape(data), ctx.shape(idx), ctx.shape(upd)
    k = ishape[-1] if ishape else 0
    if not ishape or not 1 <= k <= len(dshape) or tuple(ushape) != tuple(ishape[:-1]) + tuple(dshape[k:]):
        raise ctx.unsupported(f"indices {list(ishape)} and updates {list(ushape)} into data {list(dshape)} (updates "
                              "of the indices' shape less its last axis, then the data's shape past that many axes)")
    mode = _reduction(ctx, node) if ctx.opset >= 16 else "none"
    out, dt = node.outputs[0], ctx.dtype(data)
    rows = int(np.prod(ishape[:-1], dtype=np.int64))
    ivars = I.out_vars(len(dshape))
    if rows == 0:
        ctx.elementwise(out, dshape, dt, ctx.load(data, ivars), op="scatter_nd")
        return
    flat_idx = reshape_to(ctx, ctx.tmp(out, "rows"), idx, (rows, k))
    flat_upd = reshape_to(ctx, ctx.tmp(out, "updates"), upd, (rows,) + tuple(dshape[k:]))
    u = I.var("r0")
    lands = None
    for j in range(k):
        one = _lands(ctx, flat_idx, (u, I.const(j)), ivars[j], dshape[j], dshape[j])
        lands = one if lands is None else E.binary("and", lands, one)
    if mode == "none":
        # The last row landing on each of the k leading coordinates: an element of D[:k], not of the whole output.
        lead = tuple(dshape[:k])
        hit = ctx.emit(ctx.tmp(out, "hit"), lead, DType.I64, E.select(lands, E.index_val(u), E.imm(-1, DType.I64)),
                       kind=StageKind.REDUCE, op="scatter_nd.match", reduce=(rows,), combine=Combine.MAX)
        lead_vars = tuple(ivars[:k])
        sel = I.as_lin(I.Indirect(ctx.resolve(hit), lead_vars, rows))
        update = ctx.load(flat_upd, (sel,) + tuple(ivars[k:]))
        found = E.binary("ge", ctx.load(hit, lead_vars), E.imm(0, DType.I64))
        ctx.elementwise(out, dshape, dt, E.select(found, update, ctx.load(data, ivars)), op="scatter_nd")
        return
    found = ctx.emit(ctx.tmp(out, mode), dshape, dt,
                     E.select(lands, ctx.load(flat_upd, (u,) + tuple(ivars[k:])), _identity(mode, dt)),
                     kind=StageKind.REDUCE, op=f"scatter_nd.{mode}", reduce=(rows,), combine=_COMBINE[mode])
    _combine_into(ctx, out, data, dshape, mode, found, "scatter_nd")


@register("TensorScatter")
def convert_tensor_scatter(ctx: LowerCtx, node: OnnxNode) -> None:
    """A KV cache's update (opset 24): along the sequence axis, position s of batch entry b takes update step
    s - w[b] where that lies in [0, update length) (w: write_indices, 0 when omitted; modulo the cache length
    with mode="circular"), else keeps the past cache's value."""
    past, update = node.inputs[:2]
    shape, ushape = ctx.shape(past), ctx.shape(update)
    rank = len(shape)
    axis = ctx.axis(node, rank, -2)
    mode = ctx.attr(node, "mode", "linear")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("linear", "circular") or axis == 0 or len(ushape) != rank or any(
            u != n for d, (u, n) in enumerate(zip(ushape, shape)) if d != axis) or ushape[axis] > shape[axis]:
        raise ctx.unsupported(f"mode {mode!r}, axis {axis}, update {list(ushape)} into a cache {list(shape)} (linear "
                              "or circular; a non-batch axis; the cache's shape but a sequence no longer than it)")
    ivars = I.out_vars(rank)
    size, steps = shape[axis], ushape[axis]
    step = ivars[axis]
    if ctx.has(node, 2):
        step = step - I.as_lin(I.Indirect(ctx.resolve(node.inputs[2]), (ivars[0],), size))
    if mode == "circular":
        step = I.mod(step + size, size)
    dt = ctx.dtype(past)
    value = ctx.load(update, tuple(step if d == axis else v for d, v in enumerate(ivars)), pad=zero_of(dt))
    inside = E.binary("and", E.binary("ge", E.index_val(step), E.imm(0, DType.I64)),
                      E.binary("lt", E.index_val(step), E.imm(steps, DType.I64)))
    ctx.elementwise(node.outputs[0], shape, dt, E.select(inside, value, ctx.load(past, ivars)), op="tensor_scatter")
