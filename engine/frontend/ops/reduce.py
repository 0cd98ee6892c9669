"""Reductions (ReduceSum/Mean/Max/Min/Prod/L2/SumSquare/LogSumExp, ArgMax/ArgMin) -> reduce stages."""

from __future__ import annotations

from engine.frontend.context import LowerCtx, OnnxNode, register
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine, StageKind


def reduce_axes_of(ctx: LowerCtx, node: OnnxNode, rank: int, *, axes_input_since: int) -> tuple[int, ...] | None:
    """Normalized reduce axes (attribute before `axes_input_since`, input from then). None = none
    given (all axes unless noop_with_empty_axes)."""
    if ctx.opset >= axes_input_since:
        axes = [int(a) for a in ctx.require_const(node.inputs[1], "axes").ravel()] if ctx.has(node, 1) else None
    else:
        axes = node.attrs.get("axes")
    if axes is None or len(axes) == 0:
        return None
    return tuple(sorted({a % rank if rank else 0 for a in axes}))


def reduce_into(ctx: LowerCtx, out: str, x: str, axes: tuple[int, ...], keepdims: bool, combine: Combine,
                body_fn=lambda v: v, op: str = "reduce", dtype: DType | None = None) -> str:
    """Emit out = combine over `axes` of body_fn(x[...])."""
    shape = ctx.shape(x)
    out_shape, index, k_out, k_red = [], [], 0, 0
    for d, n in enumerate(shape):
        if d in axes:
            index.append(I.var(f"r{k_red}"))
            k_red += 1
            if keepdims:
                out_shape.append(1)
                k_out += 1
        else:
            index.append(I.var(f"i{k_out}"))
            out_shape.append(n)
            k_out += 1
    red = tuple(shape[d] for d in axes)
    body = body_fn(ctx.load(x, tuple(index)))
    if not red:  # reducing over nothing (noop): elementwise
        return ctx.elementwise(out, tuple(out_shape), dtype or body.dtype, body, op=op)
    return ctx.emit(out, tuple(out_shape), dtype or body.dtype, body, kind=StageKind.REDUCE, op=op,
                    reduce=red, combine=combine)


_SIMPLE = {"ReduceSum": Combine.SUM, "ReduceMax": Combine.MAX, "ReduceMin": Combine.MIN,
           "ReduceProd": Combine.PROD, "ReduceMean": Combine.SUM, "ReduceSumSquare": Combine.SUM,
           "ReduceL1": Combine.SUM, "ReduceL2": Combine.SUM, "ReduceLogSum": Combine.SUM,
           "ReduceLogSumExp": Combine.SUM}


@register(*_SIMPLE)
def convert_reduce(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    rank = len(ctx.shape(x))
    since = 13 if node.op_type == "ReduceSum" else 18
    axes = reduce_axes_of(ctx, node, rank, axes_input_since=since)
    if axes is None:
        axes = () if int(ctx.attr(node, "noop_with_empty_axes", 0)) else tuple(range(rank))
    keep = bool(ctx.attr(node, "keepdims", 1))
    out = node.outputs[0]
    op = node.op_type
    dt = ctx.dtype(x)
    count = 1
    for a in axes:
        count *= ctx.shape(x)[a]
    if op == "ReduceLogSumExp":
        m = reduce_into(ctx, ctx.tmp(out, "max"), x, axes, True, Combine.MAX, op="logsumexp.max")
        # exp(x - max) summed, then log + max (stable).
        mx = ctx.bload(m, ctx.shape(x))
        xs = ctx.bload(x, ctx.shape(x))
        e = ctx.elementwise(ctx.tmp(out, "exp"), ctx.shape(x), dt, E.unary("exp", E.sub(xs, mx)), op="exp")
        s = reduce_into(ctx, ctx.tmp(out, "sum"), e, axes, keep, Combine.SUM, op="logsumexp.sum")
        mk = m if keep else None
        shape = ctx.shape(s)
        if mk is None:
            mk = _squeeze_like(ctx, m, shape, axes, out)
        ctx.elementwise(out, shape, dt, E.add(E.unary("log", ctx.bload(s, shape)), ctx.bload(mk, shape)),
                        op="logsumexp")
        return
    body_fn = {"ReduceSumSquare": lambda v: E.mul(v, v), "ReduceL2": lambda v: E.mul(v, v),
               "ReduceL1": lambda v: E.unary("abs", v)}.get(op, lambda v: v)
    post = {"ReduceMean": lambda v: E.div(v, E.imm(count, dt)) if dt.is_float
            else E.binary("div", v, E.imm(count, dt)),
            "ReduceL2": lambda v: E.unary("sqrt", v), "ReduceLogSum": lambda v: E.unary("log", v)}.get(op)
    target = ctx.tmp(out, "sum") if post else out
    reduce_into(ctx, target, x, axes, keep, _SIMPLE[op], body_fn, op=op[len("Reduce"):].lower())
    if post:
        shape = ctx.shape(target)
        ctx.elementwise(out, shape, dt, post(ctx.load(target, I.out_vars(len(shape)))), op=op[6:].lower())


def _squeeze_like(ctx: LowerCtx, name: str, shape, axes, out: str) -> str:
    from engine.frontend.ops.layout import reshape_to

    return reshape_to(ctx, ctx.tmp(out, "sq"), name, tuple(shape))


@register("ArgMax", "ArgMin")
def convert_argmax(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    axis = ctx.axis(node, len(shape), 0)
    keep = bool(ctx.attr(node, "keepdims", 1))
    last = bool(ctx.attr(node, "select_last_index", 0))
    is_max = node.op_type == "ArgMax"
    combine = Combine.ARGMAX if is_max else Combine.ARGMIN
    if not last:
        reduce_into(ctx, node.outputs[0], x, (axis,), keep, combine, op=node.op_type.lower(), dtype=DType.I64)
        return
    # Last occurrence: scan the axis reversed, then map the position back (n - 1 - p).
    n = shape[axis]
    out = node.outputs[0]
    tmp = ctx.tmp(out, "rev")
    index = tuple(I.const(n - 1) - v if d == axis else v for d, v in enumerate(I.out_vars(len(shape))))
    ctx.emit(tmp, shape, ctx.dtype(x), ctx.load(x, index), kind=StageKind.LAYOUT, op="reverse")
    pos = reduce_into(ctx, ctx.tmp(out, "pos"), tmp, (axis,), keep, combine, op=node.op_type.lower(),
                      dtype=DType.I64)
    oshape = ctx.shape(pos)
    ctx.elementwise(out, oshape, DType.I64,
                    E.sub(E.imm(n - 1, DType.I64), ctx.load(pos, I.out_vars(len(oshape)))), op="argpos")


@register("CumSum", "CumProd")
def convert_cumsum(ctx: LowerCtx, node: OnnxNode) -> None:
    """A reduction over the whole axis whose term k counts where k <= i (k < i with `exclusive`; k >= i or
    k > i with `reverse`; a term that does not count is the combine's identity, 0 or 1): one stage, n terms per
    output along the axis (n^2 along it: position ids and prefix sums of short axes, as exporters write them)."""
    x = node.inputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    axes = ctx.require_const(node.inputs[1], "axis").ravel()
    if axes.size != 1 or not -rank <= int(axes[0]) < rank:
        raise ctx.unsupported(f"axis {axes.tolist()} for a rank-{rank} input (one axis in [-{rank}, {rank}))")
    axis = int(axes[0]) % rank
    exclusive, reverse = bool(int(ctx.attr(node, "exclusive", 0))), bool(int(ctx.attr(node, "reverse", 0)))
    ivars = I.out_vars(rank)
    k = I.var("r0")
    index = tuple(k if d == axis else v for d, v in enumerate(ivars))
    term = ctx.load(x, index)
    # The term counts when (k - i) compares to 0 as: k <= i, k < i, k >= i, k > i.
    op = {(False, False): "le", (True, False): "lt", (False, True): "ge", (True, True): "gt"}[(exclusive, reverse)]
    keep = E.binary(op, E.index_val(k - ivars[axis]), E.imm(0, DType.I64))
    prod = node.op_type == "CumProd"
    body = E.select(keep, term, E.imm(1 if prod else 0, term.dtype))
    ctx.emit(node.outputs[0], shape, ctx.dtype(x), body, kind=StageKind.REDUCE, op=node.op_type.lower(),
             reduce=(shape[axis],), combine=Combine.PROD if prod else Combine.SUM)


@register("TopK")
def convert_topk(ctx: LowerCtx, node: OnnxNode) -> None:
    """The k largest (or smallest) along an axis, sorted, ties to the lower index (the ONNX order), without a
    sort: each element's rank is a reduction over its axis — how many elements come before it in that order —
    the indices a reduction picking the position of rank j for output j, and the values a gather through them.
    The rank costs n terms per element (n^2 along the axis): fine for the short axes models take a top-k of
    (experts, classes, boxes), quadratic on a vocabulary."""
    x = node.inputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    axis = ctx.axis(node, rank, -1)
    if ctx.opset >= 10:
        ks = ctx.require_const(node.inputs[1], "K").ravel()
        if ks.size != 1:
            raise ctx.unsupported(f"K of {ks.size} values (one value expected)")
        k = int(ks[0])
    else:
        k = int(ctx.attr(node, "k", 0))
    n = shape[axis]
    if not 0 <= k <= n:
        raise ctx.unsupported(f"K={k} along an axis of {n} (0 <= K <= {n} expected)")
    largest = bool(int(ctx.attr(node, "largest", 1)))
    values, indices = node.outputs[0], node.outputs[1] if len(node.outputs) > 1 else ""
    ivars = I.out_vars(rank)
    m = I.var("r0")
    other = ctx.load(x, tuple(m if d == axis else v for d, v in enumerate(ivars)))
    mine = ctx.load(x, ivars)
    # Element m comes before element i: it is larger (smaller), or equal at a lower index.
    before = E.binary("or", E.binary("gt" if largest else "lt", other, mine),
                      E.binary("and", E.binary("eq", other, mine),
                               E.binary("lt", E.index_val(m - ivars[axis]), E.imm(0, DType.I64))))
    order = ctx.emit(ctx.tmp(values or indices, "rank"), shape, DType.I64,
                     E.select(before, E.imm(1, DType.I64), E.imm(0, DType.I64)), kind=StageKind.REDUCE, op="topk.rank",
                     reduce=(n,), combine=Combine.SUM)
    out_shape = tuple(k if d == axis else s for d, s in enumerate(shape))
    at = ctx.load(order, tuple(m if d == axis else v for d, v in enumerate(ivars)))
    picked = E.select(E.binary("eq", at, E.index_val(ivars[axis])), E.index_val(m), E.imm(-1, DType.I64))
    where = indices or ctx.tmp(values, "indices")
    ctx.emit(where, out_shape, DType.I64, picked, kind=StageKind.REDUCE, op="topk.indices", reduce=(n,),
             combine=Combine.MAX)
    if values:
        sel = I.as_lin(I.Indirect(ctx.resolve(where), tuple(ivars), n))
        ctx.emit(values, out_shape, ctx.dtype(x), ctx.load(x, tuple(sel if d == axis else v for d, v in enumerate(ivars))),
                 kind=StageKind.LAYOUT, op="topk.values")
