"""Pooling -> reduce stages over the window taps: MaxPool (halo reads -inf; its Indices output), AveragePool (sum,
then divide by the tap count, computed from index expressions when padding is excluded), LpPool, the global pools;
and MaxUnpool, which gathers each output's value back from the pooled map."""

from __future__ import annotations

import numpy as np

from engine.frontend.context import LowerCtx, OnnxNode, register, zero_of
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
    """The window's maximum; its Indices output (where a model asks for it: SegNet-style MaxUnpool) the least
    row-major flat input index among the window's in-range taps holding that maximum — the first in scan order,
    as onnxruntime reports it."""
    x = node.inputs[0]
    indices = node.outputs[1] if len(node.outputs) > 1 else ""
    column_major = bool(int(ctx.attr(node, "storage_order", 0)))
    spatial, kernel, w = _pool_window(ctx, node, x)
    dt = ctx.dtype(x)
    lowest = float("-inf") if dt.is_float else (False if dt == DType.BOOL else int(np.iinfo(dt.np).min))
    body = _window_load(ctx, x, spatial, kernel, w, lowest)
    out_shape = ctx.shape(x)[:2] + w.out
    values = node.outputs[0] or ctx.tmp(indices, "max")
    ctx.emit(values, out_shape, dt, body, kind=StageKind.REDUCE, op="maxpool", reduce=kernel, combine=Combine.MAX)
    if not indices:
        return
    ivars, rvars = I.out_vars(len(out_shape)), I.red_vars(len(spatial))
    taps = [tap_index(w, k, ivars[2 + k], rvars[k]) for k in range(len(spatial))]
    flat, inside = ivars[0] * ctx.shape(x)[1] + ivars[1], None
    for tap, n in zip(taps, spatial):
        flat = flat * n + tap
        ok = E.binary("and", E.binary("ge", E.index_val(tap), E.imm(0, DType.I64)),
                      E.binary("lt", E.index_val(tap), E.imm(n, DType.I64)))
        inside = ok if inside is None else E.binary("and", inside, ok)
    hit = E.binary("and", inside, E.binary("eq", body, ctx.load(values, ivars)))
    biggest = int(np.iinfo(np.int64).max)
    if not column_major:
        ctx.facts[("maxpool-indices", ctx.resolve(indices))] = (
            tuple(kernel), w, tuple(spatial))
    first = indices if not column_major else ctx.tmp(indices, "row_major")
    ctx.emit(first, out_shape, DType.I64, E.select(hit, E.index_val(flat), E.imm(biggest, DType.I64)),
             kind=StageKind.REDUCE, op="maxpool.indices", reduce=kernel, combine=Combine.MIN)
    if column_major:
        # The same element (the first in row-major scan order), its spatial position numbered column-major.
        size = int(np.prod(spatial, dtype=np.int64))
        at = ctx.load(first, ivars)
        rest, coords = E.binary("mod", at, E.imm(size, DType.I64)), []
        for n in reversed(spatial):
            coords.append(E.binary("mod", rest, E.imm(n, DType.I64)))
            rest = E.binary("div", rest, E.imm(n, DType.I64))
        coords.reverse()  # row-major coordinates, outermost first
        spot = E.imm(0, DType.I64)
        for c, n in zip(reversed(coords), reversed(spatial)):
            spot = E.add(E.mul(spot, E.imm(n, DType.I64)), c)
        base = E.sub(at, E.binary("mod", at, E.imm(size, DType.I64)))
        ctx.elementwise(indices, out_shape, DType.I64, E.add(base, spot), op="maxpool.column_major")


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


def _lp_terms(v: E.Expr, p: int) -> E.Expr:
    """|v|^p: a product for p 1 and 2 (exact; no pow), pow otherwise."""
    a = E.unary("abs", v)
    if p == 1:
        return a
    if p == 2:
        return E.mul(v, v)
    return E.binary("pow", a, E.imm(float(p), v.dtype))


def _lp_root(v: E.Expr, p: int) -> E.Expr:
    return v if p == 1 else E.unary("sqrt", v) if p == 2 else E.binary("pow", v, E.imm(1.0 / p, v.dtype))


@register("LpPool", "GlobalLpPool")
def convert_lp_pool(ctx: LowerCtx, node: OnnxNode) -> None:
    """(sum over the window of |x|^p)^(1/p): the window's sum a reduction over its taps (padding reads 0), the
    root an elementwise stage."""
    x = node.inputs[0]
    p = int(ctx.attr(node, "p", 2))
    if p < 1:
        raise ctx.unsupported(f"p={p} (1 or more)")
    dt = ctx.dtype(x)
    out = node.outputs[0]
    if node.op_type == "GlobalLpPool":
        xs = ctx.shape(x)
        total = reduce_into(ctx, ctx.tmp(out, "sum"), x, tuple(range(2, len(xs))), True, Combine.SUM,
                            body_fn=lambda v: _lp_terms(v, p), op="lppool.sum")
    else:
        spatial, kernel, w = _pool_window(ctx, node, x)
        total = ctx.emit(ctx.tmp(out, "sum"), ctx.shape(x)[:2] + w.out, dt,
                         _lp_terms(_window_load(ctx, x, spatial, kernel, w, 0.0), p), kind=StageKind.REDUCE,
                         op="lppool.sum", reduce=kernel, combine=Combine.SUM)
    shape = ctx.shape(total)
    ctx.elementwise(out, shape, dt, _lp_root(ctx.load(total, I.out_vars(len(shape))), p), op="lppool")


@register("MaxUnpool")
def convert_max_unpool(ctx: LowerCtx, node: OnnxNode) -> None:
    """Each pooled value written back at its index (row-major over the whole output), zeros elsewhere: per output
    element the last input position whose index names it (a reduction) and the value gathered there. Where the
    indices are a MaxPool's of the same window in this graph, only the inputs whose windows cover the element
    are searched (ceil(kernel / stride) per axis); other indices, any position of the element's plane."""
    from engine.frontend.ops.layout import reshape_to

    x, idx = node.inputs[:2]
    xs = ctx.shape(x)
    if len(xs) < 3 or ctx.shape(idx) != xs:
        raise ctx.unsupported(f"values {list(xs)} with indices {list(ctx.shape(idx))} (the same N x C x spatial shape)")
    spatial_in = tuple(xs[2:])
    r = len(spatial_in)
    kernel = tuple(int(k) for k in node.attrs.get("kernel_shape", ()))
    strides = tuple(int(v) for v in node.attrs.get("strides", (1,) * r))
    pads = tuple(int(v) for v in node.attrs.get("pads", (0,) * (2 * r)))
    if len(kernel) != r or len(strides) != r or len(pads) != 2 * r:
        raise ctx.unsupported(f"kernel_shape {list(kernel)}, strides {list(strides)}, pads {list(pads)} for "
                              f"{r} spatial axes")
    if ctx.has(node, 2):
        out_shape = tuple(int(v) for v in ctx.require_const(node.inputs[2], "output_shape").ravel())
        if len(out_shape) != len(xs) or out_shape[:2] != xs[:2]:
            raise ctx.unsupported(f"output_shape {list(out_shape)} for values {list(xs)}")
    else:
        out_shape = xs[:2] + tuple((n - 1) * s + k - pads[d] - pads[d + r]
                                   for d, (n, s, k) in enumerate(zip(spatial_in, strides, kernel)))
    out, dt = node.outputs[0], ctx.dtype(x)
    plane = int(np.prod(spatial_in, dtype=np.int64))
    flat_x = reshape_to(ctx, ctx.tmp(out, "values"), x, xs[:2] + (plane,))
    flat_i = reshape_to(ctx, ctx.tmp(out, "indices"), idx, xs[:2] + (plane,))
    ivars = I.out_vars(len(out_shape))
    spatial_out = out_shape[2:]
    here = ivars[0] * out_shape[1] + ivars[1]
    for d in range(r):
        here = here * spatial_out[d] + ivars[2 + d]
    window = ctx.facts.get(("maxpool-indices", ctx.resolve(idx)))
    same = window is not None and window[0] == kernel and window[1].strides == strides and \
        window[1].pad_begin == pads[:r] and window[2] == spatial_out
    if same:
        counts = tuple(-(-k // s) for k, s in zip(kernel, strides))
        tvars = I.red_vars(r)
        qs = [I.floordiv(ivars[2 + d] + pads[d], strides[d]) - tvars[d] for d in range(r)]
        pos, ok = I.const(0), None
        for d, q in enumerate(qs):
            pos = pos * spatial_in[d] + q
            inside = E.binary("and", E.binary("ge", E.index_val(q), E.imm(0, DType.I64)),
                              E.binary("lt", E.index_val(q), E.imm(spatial_in[d], DType.I64)))
            ok = inside if ok is None else E.binary("and", ok, inside)
        named = ctx.load(idx, (ivars[0], ivars[1]) + tuple(qs), pad=-1)
        match = E.binary("and", ok, E.binary("eq", named, E.index_val(here)))
        reduce = counts
    else:
        j = I.var("r0")
        pos = j
        match = E.binary("eq", ctx.load(flat_i, (ivars[0], ivars[1], j)), E.index_val(here))
        reduce = (plane,)
    hit = ctx.emit(ctx.tmp(out, "hit"), out_shape, DType.I64, E.select(match, E.index_val(pos), E.imm(-1, DType.I64)),
                   kind=StageKind.REDUCE, op="maxunpool.match", reduce=reduce, combine=Combine.MAX)
    value = ctx.load(flat_x, (ivars[0], ivars[1], I.as_lin(I.Indirect(ctx.resolve(hit), tuple(ivars), plane))))
    found = E.binary("ge", ctx.load(hit, ivars), E.imm(0, DType.I64))
    ctx.elementwise(out, out_shape, dt, E.select(found, value, E.imm(zero_of(dt), dt)), op="maxunpool")
