"""Pooling -> reduce stages over the window taps: MaxPool (halo reads -inf), AveragePool (sum, then
divide by the tap count, computed from index expressions when padding is excluded), and the global pools."""

from __future__ import annotations

import numpy as np

from engine.frontend.context import LowerCtx, OnnxNode, register
from engine.frontend.ops.conv import Window, has_halo, tap_index, window_of
from engine.frontend.ops.reduce import reduce_into
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine, StageKind


def _pool_window(ctx: LowerCtx, node: OnnxNode, x: str) -> tuple[tuple[int, ...], tuple[int, ...], Window]:
    xs = ctx.shape(x)
    if len(xs) < 3:
        raise ctx.unsupported(f"pooling an input of rank {len(xs)} (need N, C and spatial axes)")
    spatial = tuple(xs[2:])
    kernel = tuple(int(k) for k in node.attrs["kernel_shape"])
    w = window_of(ctx, node, spatial, kernel, ceil_mode=bool(ctx.attr(node, "ceil_mode", 0)))
    # Taps past the padded input only ever read the pad value: a window larger than the padded extent
    # (transformers' EfficientNet pools with a 1280-wide ceil-mode window over a 7x7 map) reduces over
    # the taps that can land inside, not over kernel^2 pad reads.
    reach = tuple(-(-(n + b + e) // d) for n, b, e, d in zip(spatial, w.pad_begin, w.pad_end, w.dilations))
    return spatial, tuple(min(k, r) for k, r in zip(kernel, reach)), w


def _window_load(ctx: LowerCtx, x: str, spatial, kernel, w: Window, pad) -> E.Expr:
    ivars, rvars = I.out_vars(2 + len(spatial)), I.red_vars(len(spatial))
    idx = (ivars[0], ivars[1]) + tuple(tap_index(w, k, ivars[2 + k], rvars[k]) for k in range(len(spatial)))
    return ctx.load(x, idx, pad=pad if has_halo(w, spatial, kernel) else None)


@register("MaxPool")
def convert_max_pool(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    if len([o for o in node.outputs if o]) > 1:
        raise ctx.unsupported("the Indices output")
    if int(ctx.attr(node, "storage_order", 0)):
        raise ctx.unsupported("storage_order=1")
    spatial, kernel, w = _pool_window(ctx, node, x)
    dt = ctx.dtype(x)
    lowest = float("-inf") if dt.is_float else (False if dt == DType.BOOL else int(np.iinfo(dt.np).min))
    body = _window_load(ctx, x, spatial, kernel, w, lowest)
    ctx.emit(node.outputs[0], ctx.shape(x)[:2] + w.out, dt, body, kind=StageKind.REDUCE, op="maxpool",
             reduce=kernel, combine=Combine.MAX)


def _tap_count(w: Window, k: int, n: int, kernel: int, out_var: I.Lin, include_pad: bool) -> I.Lin:
    """Taps of the window at `out_var` along axis k that are counted: inside the input, or (with
    `include_pad`) inside the input plus its explicit padding (never the ceil-mode overhang)."""
    start = out_var * w.strides[k] - w.pad_begin[k]
    d = w.dilations[k]
    hi_limit = n + w.pad_end[k] if include_pad else n
    # Last tap t with start + t*d < hi_limit, capped at kernel - 1.
    last = I.imin(I.floordiv(hi_limit - 1 - start, d), kernel - 1)
    if include_pad:
        return last + 1
    # First tap t with start + t*d >= 0: ceil(-start / d), at least 0.
    first = I.imax(-I.floordiv(start, d) if d > 1 else -start, 0)
    return last - first + 1


@register("AveragePool")
def convert_avg_pool(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    spatial, kernel, w = _pool_window(ctx, node, x)
    dt = ctx.dtype(x)
    out = node.outputs[0]
    shape = ctx.shape(x)[:2] + w.out
    include = bool(ctx.attr(node, "count_include_pad", 0))
    s = ctx.emit(ctx.tmp(out, "sum"), shape, dt, _window_load(ctx, x, spatial, kernel, w, 0.0),
                 kind=StageKind.REDUCE, op="avgpool.sum", reduce=kernel, combine=Combine.SUM)
    ivars = I.out_vars(len(shape))
    count = None
    uniform = 1
    for k, n in enumerate(spatial):
        c = _tap_count(w, k, n, kernel[k], ivars[2 + k], include)
        ranges = {f"i{2 + k}": (0, w.out[k] - 1)}
        (lo, hi), _ = I.bounds(I.simplify(c, ranges), ranges)
        if lo == hi:  # the same count everywhere along this axis: fold it into a constant
            uniform *= lo
            continue
        term = E.cast(E.index_val(c), dt)
        count = term if count is None else E.mul(count, term)
    denom = E.imm(uniform, dt) if count is None else (count if uniform == 1 else E.mul(count, E.imm(uniform, dt)))
    ctx.elementwise(out, shape, dt, E.div(ctx.load(s, ivars), denom), op="avgpool")


@register("GlobalAveragePool", "GlobalMaxPool")
def convert_global_pool(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    xs = ctx.shape(x)
    axes = tuple(range(2, len(xs)))
    dt = ctx.dtype(x)
    if node.op_type == "GlobalMaxPool":
        reduce_into(ctx, node.outputs[0], x, axes, True, Combine.MAX, op="globalmaxpool")
        return
    count = 1
    for a in axes:
        count *= xs[a]
    inv = E.imm(1.0 / count, dt)
    reduce_into(ctx, node.outputs[0], x, axes, True, Combine.SUM, body_fn=lambda v: E.mul(v, inv),
                op="globalavgpool")
