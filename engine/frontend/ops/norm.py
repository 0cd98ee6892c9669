"""Channel normalizations: BatchNormalization (inference; constant statistics fold into one per-channel
scale/shift stage), InstanceNormalization and GroupNormalization (mean, variance, normalize); LpNormalization,
LRN (local response normalization across channels) and Hardmax."""

from __future__ import annotations

import numpy as np

from engine.frontend.context import LowerCtx, OnnxNode, register
from engine.frontend.ops.layout import reshape_to
from engine.frontend.ops.nn import normalize_into
from engine.frontend.ops.reduce import reduce_into
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine, StageKind


@register("BatchNormalization")
def convert_batch_norm(ctx: LowerCtx, node: OnnxNode) -> None:
    x, scale, bias, mean, var = node.inputs[:5]
    if int(ctx.attr(node, "training_mode", 0)) or len([o for o in node.outputs if o]) > 1:
        raise ctx.unsupported("training mode (running statistics outputs)")
    shape = ctx.shape(x)
    dt = ctx.dtype(x)
    eps = float(ctx.attr(node, "epsilon", 1e-5))
    ivars = I.out_vars(len(shape))
    chan = (ivars[1],) if len(shape) > 1 else (I.const(0),)
    values = [ctx.const(n) for n in (scale, bias, mean, var)]
    out = node.outputs[0]
    if all(v is not None for v in values):
        # Fold at import: y = x * a[c] + b[c] with a = scale / sqrt(var + eps), b = bias - mean * a.
        s, b, m, v = (np.asarray(t, dtype=np.float64) for t in values)
        a = s / np.sqrt(v + eps)
        a_name = ctx.fresh(f"{out}::scale")
        ctx.set_const(a_name, a.astype(dt.np))
        b_name = ctx.fresh(f"{out}::shift")
        ctx.set_const(b_name, (b - m * a).astype(dt.np))
        y = E.add(E.mul(ctx.load(x, ivars), ctx.load(a_name, chan)), ctx.load(b_name, chan))
    else:
        ld = [ctx.load(n, chan) for n in (scale, bias, mean, var)]
        inv = E.unary("rsqrt", E.add(ld[3], E.imm(eps, dt)))
        y = E.add(E.mul(E.sub(ctx.load(x, ivars), ld[2]), E.mul(ld[0], inv)), ld[1])
    ctx.elementwise(out, shape, dt, y, op="batchnorm")


@register("InstanceNormalization")
def convert_instance_norm(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    rank = len(ctx.shape(x))
    normalize_into(ctx, node.outputs[0], x, tuple(range(2, rank)), float(ctx.attr(node, "epsilon", 1e-5)),
                   node.inputs[1], node.inputs[2], param_axis=1)


@register("GroupNormalization")
def convert_group_norm(ctx: LowerCtx, node: OnnxNode) -> None:
    """Statistics over [N, G, C/G, spatial] (a reshape view), scale/bias per group (opset 18) or per
    channel (opset 21), then back to the input's shape."""
    x, scale, bias = node.inputs[:3]
    shape = ctx.shape(x)
    groups = int(node.attrs["num_groups"])
    n, c = shape[0], shape[1]
    if c % groups:
        raise ctx.unsupported(f"num_groups={groups} with {c} channels")
    if int(ctx.attr(node, "stash_type", 1)) != 1:
        raise ctx.unsupported("stash_type other than float32")
    cg = c // groups
    spatial = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    out = node.outputs[0]
    x4 = reshape_to(ctx, ctx.tmp(out, "grouped"), x, (n, groups, cg, spatial))
    per_channel = ctx.shape(scale)[0] == c and (ctx.opset >= 21 or c != groups)
    y4 = ctx.tmp(out, "norm4")
    normalize_into(ctx, y4, x4, (2, 3), float(ctx.attr(node, "epsilon", 1e-5)), None, None)
    i = I.out_vars(4)
    pidx = (i[1] * cg + i[2],) if per_channel else (i[1],)
    dt = ctx.dtype(x)
    y = E.add(E.mul(ctx.load(y4, i), ctx.load(scale, pidx)), ctx.load(bias, pidx))
    scaled = ctx.elementwise(ctx.tmp(out, "affine"), (n, groups, cg, spatial), dt, y, op="groupnorm.affine")
    reshape_to(ctx, out, scaled, shape)


@register("LpNormalization")
def convert_lp_normalization(ctx: LowerCtx, node: OnnxNode) -> None:
    """x / ||x||_p along the axis (p 1 or 2; no epsilon: a zero norm gives 0, as the ONNX reference has it)."""
    x = node.inputs[0]
    shape = ctx.shape(x)
    axis = ctx.axis(node, len(shape), -1)
    p = int(ctx.attr(node, "p", 2))
    if p not in (1, 2):
        raise ctx.unsupported(f"p={p} (1 or 2)")
    out = node.outputs[0]
    terms = (lambda v: E.unary("abs", v)) if p == 1 else (lambda v: E.mul(v, v))
    total = reduce_into(ctx, ctx.tmp(out, "sum"), x, (axis,), True, Combine.SUM, terms, op=f"l{p}")
    dt = ctx.dtype(x)
    norm = ctx.bload(total, shape)
    scaled = E.div(ctx.bload(x, shape), E.unary("sqrt", norm) if p == 2 else norm)
    ctx.elementwise(out, shape, dt, E.select(E.binary("eq", norm, E.imm(0, dt)), E.imm(0, dt), scaled),
                    op="lp_normalize")


@register("LRN")
def convert_lrn(ctx: LowerCtx, node: OnnxNode) -> None:
    """y = x / (bias + alpha / size * sum of x^2 over the `size` channels around each)^beta: the window sum a
    reduction over its taps (channels outside the tensor read 0), then one elementwise stage."""
    x = node.inputs[0]
    shape = ctx.shape(x)
    size = int(ctx.attr(node, "size", 0))
    if len(shape) < 3 or size < 1:
        raise ctx.unsupported(f"an input of rank {len(shape)} with size {size} (N x C x spatial, size >= 1)")
    alpha, beta, bias = (float(ctx.attr(node, k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    out, dt = node.outputs[0], ctx.dtype(x)
    ivars = I.out_vars(len(shape))
    tap = I.var("r0")
    c = ivars[1] + tap - (size - 1) // 2
    v = ctx.load(x, (ivars[0], c) + tuple(ivars[2:]), pad=0.0)
    total = ctx.emit(ctx.tmp(out, "square_sum"), shape, dt, E.mul(v, v), kind=StageKind.REDUCE, op="lrn.sum",
                     reduce=(size,), combine=Combine.SUM)
    scale = E.add(E.imm(bias, dt), E.mul(E.imm(alpha / size, dt), ctx.load(total, ivars)))
    ctx.elementwise(out, shape, dt, E.div(ctx.load(x, ivars), E.binary("pow", scale, E.imm(beta, dt))), op="lrn")


@register("Hardmax")
def convert_hardmax(ctx: LowerCtx, node: OnnxNode) -> None:
    """1 at the first largest element along the axis, 0 elsewhere (before opset 13 over the input flattened to
    2-D at the axis, as Softmax then was)."""
    x = node.inputs[0]
    shape = ctx.shape(x)
    axis = ctx.axis(node, len(shape), -1 if ctx.opset >= 13 else 1)
    out, dt = node.outputs[0], ctx.dtype(x)
    src, work = x, tuple(shape)
    if ctx.opset < 13 and len(shape) > 2:
        work = (int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64)))
        src, axis = reshape_to(ctx, ctx.tmp(out, "2d"), x, work), 1
    first = reduce_into(ctx, ctx.tmp(out, "argmax"), src, (axis,), True, Combine.ARGMAX, op="hardmax.argmax",
                        dtype=DType.I64)
    ivars = I.out_vars(len(work))
    hit = E.binary("eq", E.index_val(ivars[axis]), ctx.bload(first, work))
    target = out if work == tuple(shape) else ctx.tmp(out, "flat")
    ctx.elementwise(target, work, dt, E.select(hit, E.imm(1, dt), E.imm(0, dt)), op="hardmax")
    if target != out:
        reshape_to(ctx, out, target, tuple(shape))
