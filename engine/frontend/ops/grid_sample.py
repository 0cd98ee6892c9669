"""GridSample (opsets 16-22: 2-D from 16, any number of spatial axes from 20): each output position reads the
input where the grid points, interpolated nearest, (bi/tri)linear or cubic, with zeros, border or reflection
padding — PyTorch's grid_sampler rules, which onnxruntime and the ONNX reference follow: the grid's normalized
coordinate mapped to the input's (align_corners), rounded half to even for nearest, clamped or reflected into the
borders where outside them (not for cubic: there the reference clamps the coordinate first and PyTorch and
onnxruntime do not), then each tap's index clamped or reflected on its own (zeros: a tap outside reads 0).

Per spatial axis one stage holds that coordinate per output position, and per tap of the interpolation one stage
its input index (int64, always inside the axis) and one its weight (0 for a zeros-padded tap outside); the output
sums, over every combination of taps, the product of the axes' weights times the input gathered at their
indices. Work per element: the taps (1, 2^r or 4^r), as the reference computes."""

from __future__ import annotations

import itertools

from engine.frontend.context import LowerCtx, OnnxNode, register
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType

_MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic", "cubic": "cubic"}
_CUBIC_A = -0.75
F32 = DType.F32


def _f(v: float) -> E.Expr:
    return E.imm(float(v), F32)


def _reflect(x: E.Expr, lo: float, hi: float) -> E.Expr:
    """`x` reflected off the borders lo and hi until inside them (the reference's `_gs_reflect`)."""
    span = hi - lo
    if span <= 0:
        return _f(lo)  # a one-element axis with align_corners: every coordinate reflects onto it
    def folded(dist: E.Expr) -> tuple[E.Expr, E.Expr]:
        """(whether dist spans an even number of whole spans, what is left of it past them)"""
        turns = E.unary("floor", E.div(dist, _f(span)))
        return E.binary("eq", E.binary("fmod", turns, _f(2.0)), _f(0.0)), E.sub(dist, E.mul(turns, _f(span)))

    below, above = E.sub(_f(lo), x), E.sub(x, _f(hi))
    even, rest = folded(below)
    out = E.select(E.binary("gt", below, _f(0.0)), E.select(even, E.add(_f(lo), rest), E.sub(_f(hi), rest)), x)
    even, rest = folded(above)
    out = E.select(E.binary("gt", above, _f(0.0)), E.select(even, E.sub(_f(hi), rest), E.add(_f(lo), rest)), out)
    return out


def _cubic(k: int, t: E.Expr) -> E.Expr:
    """Keys' cubic convolution weight of tap k (-1..2) at fraction t of the way from tap 0 to tap 1."""
    a = _CUBIC_A
    if k in (0, 1):
        x = t if k == 0 else E.sub(_f(1.0), t)
        return E.add(E.mul(E.mul(E.sub(E.mul(_f(a + 2), x), _f(a + 3)), x), x), _f(1.0))
    x = E.add(t, _f(1.0)) if k == -1 else E.sub(_f(2.0), t)
    return E.sub(E.mul(E.add(E.mul(E.sub(E.mul(_f(a), x), _f(5 * a)), x), _f(8 * a)), x), _f(4 * a))


@register("GridSample")
def convert_grid_sample(ctx: LowerCtx, node: OnnxNode) -> None:
    x, grid = node.inputs[:2]
    shape, gshape = ctx.shape(x), ctx.shape(grid)
    r = len(shape) - 2
    mode = ctx.attr(node, "mode", "linear" if ctx.opset >= 20 else "bilinear")
    mode = _MODES.get(mode.decode() if isinstance(mode, bytes) else str(mode))
    padding = ctx.attr(node, "padding_mode", "zeros")
    padding = padding.decode() if isinstance(padding, bytes) else str(padding)
    if r < 1 or len(gshape) != r + 2 or gshape[0] != shape[0] or gshape[-1] != r or mode is None or padding not in (
            "zeros", "border", "reflection"):
        raise ctx.unsupported(f"an input {list(shape)} sampled by a grid {list(gshape)} with mode "
                              f"{ctx.attr(node, 'mode', '')!r}, padding {padding!r} (N x C x r spatial axes, a grid "
                              "N x out... x r; linear, nearest or cubic; zeros, border or reflection)")
    align = bool(int(ctx.attr(node, "align_corners", 0)))
    out = node.outputs[0]
    out_shape = (shape[0], shape[1]) + tuple(gshape[1:-1])
    where = tuple(gshape[:-1])  # per output position, channels aside
    gvars = I.out_vars(len(where))
    taps = {"nearest": (0,), "linear": (0, 1), "cubic": (-1, 0, 1, 2)}[mode]
    per_axis = []
    for d in range(r):
        size = shape[2 + d]
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        g = E.cast(ctx.load(grid, tuple(gvars) + (I.const(r - 1 - d),)), F32)  # the grid lists x (last axis) first
        c = (E.mul(E.div(E.add(g, _f(1.0)), _f(2.0)), _f(size - 1)) if align
             else E.div(E.sub(E.mul(E.add(g, _f(1.0)), _f(size)), _f(1.0)), _f(2.0)))
        if mode == "nearest":
            c = E.unary("round", c)
        outside = E.binary("or", E.binary("lt", c, _f(lo)), E.binary("gt", c, _f(hi)))
        if mode == "cubic":
            pass  # PyTorch (and onnxruntime) pad a cubic's taps alone, not its coordinate first
        elif padding == "border":
            c = E.select(outside, E.binary("min", E.binary("max", c, _f(0.0)), _f(size - 1)), c)
        elif padding == "reflection":
            c = E.select(outside, _reflect(c, lo, hi), c)
        coord = ctx.elementwise(ctx.tmp(out, f"coord{d}"), where, F32, c, op="grid_sample.coord")
        cv = ctx.load(coord, gvars)
        base = cv if mode == "nearest" else E.unary("floor", cv)
        frac = E.sub(cv, base)
        axis = []
        for k in taps:
            tap = E.add(base, _f(k)) if k else base
            inside = E.binary("and", E.binary("ge", tap, _f(0.0)), E.binary("le", tap, _f(size - 1)))
            if padding == "reflection":
                tap = _reflect(tap, lo, hi)
            index = E.binary("min", E.binary("max", E.cast(tap, DType.I64), E.imm(0, DType.I64)),
                             E.imm(size - 1, DType.I64))
            idx = ctx.elementwise(ctx.tmp(out, f"index{d}_{k + 1}"), where, DType.I64, index, op="grid_sample.index")
            weight = (_f(1.0) if mode == "nearest" else (E.sub(_f(1.0), frac) if k == 0 else frac)
                      if mode == "linear" else _cubic(k, frac))
            if padding == "zeros":
                weight = E.select(inside, weight, _f(0.0))
            w = ctx.elementwise(ctx.tmp(out, f"weight{d}_{k + 1}"), where, F32, weight, op="grid_sample.weight")
            axis.append((idx, w))
        per_axis.append(axis)
    ovars = I.out_vars(len(out_shape))
    at = (ovars[0],) + tuple(ovars[2:])  # an output position's index into the per-position stages
    total = None
    for combo in itertools.product(*per_axis):
        index = (ovars[0], ovars[1]) + tuple(I.as_lin(I.Indirect(ctx.resolve(idx), at, shape[2 + d]))
                                             for d, (idx, _) in enumerate(combo))
        term = E.cast(ctx.load(x, index), F32)
        for _, w in combo:
            term = E.mul(ctx.load(w, at), term)
        total = term if total is None else E.add(total, term)
    ctx.elementwise(out, out_shape, ctx.dtype(x), E.cast(total, ctx.dtype(x)), op="grid_sample")
