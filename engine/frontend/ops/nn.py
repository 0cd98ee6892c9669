"""Neural-network ops: MatMul/Gemm (contractions), Softmax/LogSoftmax and the normalizations,
lowered to the primitive stages AStitch and Welder reason about (max, exp-sum, divide; mean,
variance, normalize)."""

from __future__ import annotations

from engine.frontend.context import LowerCtx, OnnxNode, broadcast_shapes, register
from engine.frontend.ops.reduce import reduce_into
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.graph import Combine, StageKind


def matmul_into(ctx: LowerCtx, out: str, a: str, b: str, *, op: str = "matmul") -> str:
    """out = a @ b with NumPy matmul semantics (1-D promotion, batch broadcasting)."""
    sa, sb = list(ctx.shape(a)), list(ctx.shape(b))
    a1, b1 = len(sa) == 1, len(sb) == 1
    if a1:
        sa = [1] + sa
    if b1:
        sb = sb + [1]
    m, k = sa[-2], sa[-1]
    k2, n = sb[-2], sb[-1]
    if k != k2:
        raise ctx.unsupported(f"matmul of shapes {ctx.shape(a)} and {ctx.shape(b)} (inner dims differ)")
    batch = broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2]))
    full = tuple(batch) + (m, n)
    nb = len(batch)
    ivars = I.out_vars(len(full))
    r = I.var("r0")

    def operand_index(shape, rows_var, cols_var):
        lead = shape[:-2]
        off = nb - len(lead)
        idx = [I.const(0) if lead[d] == 1 else ivars[off + d] for d in range(len(lead))]
        return idx + [rows_var, cols_var]

    ia = operand_index(sa, ivars[nb], r)
    ib = operand_index(sb, r, ivars[nb + 1])
    if a1:
        ia = ia[-1:]  # drop the promoted row
    if b1:
        ib = ib[:-1]
    out_shape = list(full)
    body = E.mul(ctx.load(a, tuple(ia)), ctx.load(b, tuple(ib)))
    if a1 or b1:
        # Compute over the promoted shape, then the result drops the unit axes via index remap.
        tmp = ctx.tmp(out, "mm")
        ctx.emit(tmp, tuple(out_shape), ctx.dtype(a), body, kind=StageKind.CONTRACTION, op=op,
                 reduce=(k,), combine=Combine.SUM)
        final = list(batch) + ([] if a1 else [m]) + ([] if b1 else [n])
        from engine.frontend.ops.layout import reshape_to

        return reshape_to(ctx, out, tmp, tuple(final))
    return ctx.emit(out, tuple(out_shape), ctx.dtype(a), body, kind=StageKind.CONTRACTION, op=op,
                    reduce=(k,), combine=Combine.SUM)


@register("MatMul")
def convert_matmul(ctx: LowerCtx, node: OnnxNode) -> None:
    matmul_into(ctx, node.outputs[0], node.inputs[0], node.inputs[1])


def softmax_into(ctx: LowerCtx, out: str, x: str, axis: int, *, log: bool = False, guarded: bool = False,
                 out_dtype=None) -> str:
    """max -> exp(x - max) -> sum -> divide (or x - max - log(sum) for LogSoftmax). `guarded` (Attention's
    softmax, as the ONNX reference computes it): a row whose every value is -inf gives 0, not NaN — its max
    taken as 0, its sum as 1. `out_dtype`: the result cast to it (default `x`'s dtype, in which it runs)."""
    shape = ctx.shape(x)
    dt = ctx.dtype(x)
    m = reduce_into(ctx, ctx.tmp(out, "max"), x, (axis,), True, Combine.MAX, op="softmax.max")
    xs, ms = ctx.bload(x, shape), ctx.bload(m, shape)
    if guarded:
        ms = E.select(E.binary("eq", ms, E.imm(float("-inf"), dt)), E.imm(0.0, dt), ms)
    if log:
        e = ctx.elementwise(ctx.tmp(out, "exp"), shape, dt, E.unary("exp", E.sub(xs, ms)), op="exp")
        s = reduce_into(ctx, ctx.tmp(out, "sum"), e, (axis,), True, Combine.SUM, op="logsoftmax.sum")
        body = E.sub(E.sub(xs, ms), E.unary("log", ctx.bload(s, shape)))
        return ctx.elementwise(out, shape, dt, body, op="logsoftmax")
    e = ctx.elementwise(ctx.tmp(out, "exp"), shape, dt, E.unary("exp", E.sub(xs, ms)), op="exp")
    s = reduce_into(ctx, ctx.tmp(out, "sum"), e, (axis,), True, Combine.SUM, op="softmax.sum")
    total = ctx.bload(s, shape)
    if guarded:
        total = E.select(E.binary("eq", total, E.imm(0.0, dt)), E.imm(1.0, dt), total)
    out_dtype = out_dtype or dt
    return ctx.elementwise(out, shape, out_dtype, E.cast(E.div(ctx.bload(e, shape), total), out_dtype), op="softmax")


@register("Softmax", "LogSoftmax")
def convert_softmax(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    axis = ctx.axis(node, len(shape), -1 if ctx.opset >= 13 else 1)
    log = node.op_type == "LogSoftmax"
    if ctx.opset >= 13 or axis == len(shape) - 1:
        softmax_into(ctx, node.outputs[0], x, axis, log=log)
        return
    # Before opset 13: softmax over the flattened trailing axes [axis:].
    import numpy as np

    from engine.frontend.ops.layout import reshape_to

    flat = (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))
    out = node.outputs[0]
    x2 = reshape_to(ctx, ctx.tmp(out, "flat"), x, flat)
    y2 = softmax_into(ctx, ctx.tmp(out, "sm"), x2, 1, log=log)
    reshape_to(ctx, out, y2, shape)


def normalize_into(ctx: LowerCtx, out: str, x: str, axes: tuple[int, ...], eps: float,
                   scale: str | None, bias: str | None, *, param_axis: int | None = None,
                   mean_out: str | None = None, invstd_out: str | None = None) -> str:
    """mean -> variance (mean of squared deviation) -> (x - mean) * rsqrt(var + eps) * scale + bias.
    Scale/bias broadcast NumPy-style, or along `param_axis` when they are 1-D per-channel vectors.
    `mean_out`/`invstd_out` name the statistics when the node exports them (LayerNormalization)."""
    shape = ctx.shape(x)
    dt = ctx.dtype(x)
    count = 1
    for a in axes:
        count *= shape[a]
    inv = E.imm(1.0 / count, dt)
    mean = reduce_into(ctx, mean_out or ctx.tmp(out, "mean"), x, axes, True, Combine.SUM,
                       body_fn=lambda v: E.mul(v, inv), op="norm.mean")
    xs, ms = ctx.bload(x, shape), ctx.bload(mean, shape)
    d = ctx.elementwise(ctx.tmp(out, "dev"), shape, dt, E.sub(xs, ms), op="sub")
    var = reduce_into(ctx, ctx.tmp(out, "var"), d, axes, True, Combine.SUM,
                      body_fn=lambda v: E.mul(E.mul(v, v), inv), op="norm.var")
    if invstd_out:
        vshape = ctx.shape(var)
        rs = E.unary("rsqrt", E.add(ctx.load(var, I.out_vars(len(vshape))), E.imm(eps, dt)))
        istd = ctx.bload(ctx.elementwise(invstd_out, vshape, dt, rs, op="norm.invstd"), shape)
    else:
        istd = E.unary("rsqrt", E.add(ctx.bload(var, shape), E.imm(eps, dt)))
    y = E.mul(ctx.bload(d, shape), istd)

    def param(name: str) -> E.Expr:
        if param_axis is None:
            return ctx.bload(name, shape)
        return ctx.load(name, (I.out_vars(len(shape))[param_axis],))

    if scale:
        y = E.mul(y, param(scale))
    if bias:
        y = E.add(y, param(bias))
    return ctx.elementwise(out, shape, dt, y, op="normalize")


@register("LayerNormalization")
def convert_layer_norm(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    rank = len(ctx.shape(x))
    axis = ctx.axis(node, rank, -1)
    if int(ctx.attr(node, "stash_type", 1)) != 1:
        raise ctx.unsupported("stash_type other than float32")
    outs = list(node.outputs) + ["", ""]
    normalize_into(ctx, node.outputs[0], x, tuple(range(axis, rank)), float(ctx.attr(node, "epsilon", 1e-5)),
                   node.inputs[1] if ctx.has(node, 1) else None, node.inputs[2] if ctx.has(node, 2) else None,
                   mean_out=outs[1] or None, invstd_out=outs[2] or None)


@register("Gemm")
def convert_gemm(ctx: LowerCtx, node: OnnxNode) -> None:
    """Y = alpha * A' @ B' + beta * C: one contraction, then an elementwise epilogue when needed."""
    a, b = node.inputs[0], node.inputs[1]
    sa, sb = ctx.shape(a), ctx.shape(b)
    if len(sa) != 2 or len(sb) != 2:
        raise ctx.unsupported(f"Gemm of shapes {sa} and {sb} (both must be 2-D)")
    ta, tb = int(ctx.attr(node, "transA", 0)), int(ctx.attr(node, "transB", 0))
    m, k = (sa[1], sa[0]) if ta else sa
    k2, n = (sb[1], sb[0]) if tb else sb
    if k != k2:
        raise ctx.unsupported(f"Gemm of shapes {sa} and {sb} with transA={ta} transB={tb} (inner dims differ)")
    i, j = I.out_vars(2)
    r = I.var("r0")
    body = E.mul(ctx.load(a, (r, i) if ta else (i, r)), ctx.load(b, (j, r) if tb else (r, j)))
    alpha, beta = float(ctx.attr(node, "alpha", 1.0)), float(ctx.attr(node, "beta", 1.0))
    has_c = ctx.has(node, 2) and beta != 0.0
    out = node.outputs[0]
    dt = ctx.dtype(a)
    plain = alpha == 1.0 and not has_c
    mm = ctx.emit(out if plain else ctx.tmp(out, "mm"), (m, n), dt, body, kind=StageKind.CONTRACTION,
                  op="matmul", reduce=(k,), combine=Combine.SUM)
    if plain:
        return
    y = ctx.load(mm, (i, j))
    if alpha != 1.0:
        y = E.mul(y, E.imm(alpha, dt))
    if has_c:
        c = ctx.bload(node.inputs[2], (m, n))
        y = E.add(y, c if beta == 1.0 else E.mul(c, E.imm(beta, dt)))
    ctx.elementwise(out, (m, n), dt, y, op="gemm.epilogue")
