"""Integer products as quantized exports write them: MatMulInteger and ConvInteger (onnxruntime's dynamic
quantization: uint8/int8 operands less their zero points, an int32 product), QLinearMatMul and QLinearConv (the
same products requantized: scaled by x_scale * w_scale / y_scale in fp32, rounded half to even, plus y's zero
point, saturated). The operands less their zero points are int32 elementwise stages (fused into the product's
loads; a conv's padding reads 0 of them, the zero point of the input), the product an int32 contraction through
the MatMul and Conv converters — exact, as onnxruntime's integer kernels are, where fp32 would round sums past
2^24."""

from __future__ import annotations

import numpy as np

from engine.frontend.context import CONVERTERS, LowerCtx, OnnxNode, register
from engine.frontend.ops.nn import matmul_into
from engine.frontend.ops.quant import saturated
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType

I32 = DType.I32


def _shifted(ctx: LowerCtx, out: str, x: str, zero: str | None, axis_of_zero: int, what: str) -> str:
    """x as int32 less its zero point (one for the tensor, or one per index along `axis_of_zero`: a row of A, a
    column of B, an output channel of a conv weight); x itself widened where there is none."""
    shape = ctx.shape(x)
    ivars = I.out_vars(len(shape))
    value = E.cast(ctx.load(x, ivars), I32)
    if zero:
        zshape = ctx.shape(zero)
        count = int(np.prod(zshape, dtype=np.int64))
        if count == 1:
            z = ctx.load(zero, tuple(I.const(0) for _ in zshape))
        elif len(zshape) == 1 and len(shape) >= 2 and count == shape[axis_of_zero]:
            z = ctx.load(zero, (ivars[axis_of_zero],))
        else:
            raise ctx.unsupported(f"a zero point of shape {list(zshape)} for {what} of shape {list(shape)} (one value, "
                                  f"or one per index of its axis {axis_of_zero})")
        value = E.sub(value, E.cast(z, I32))
    return ctx.elementwise(ctx.tmp(out, what), shape, I32, value, op="zero_point")


def _bytes(ctx: LowerCtx, *names: str) -> None:
    for name in names:
        if ctx.dtype(name) not in (DType.U8, DType.I8):
            raise ctx.unsupported(f"an operand '{name}' of type {ctx.dtype(name).value} (uint8 or int8)")


def _product(ctx: LowerCtx, node: OnnxNode, out: str, a: str, b: str, za: str, zb: str) -> str:
    _bytes(ctx, a, b)
    sa, sb = ctx.shape(a), ctx.shape(b)
    a32 = _shifted(ctx, out, a, za, len(sa) - 2, "a")
    b32 = _shifted(ctx, out, b, zb, len(sb) - 1, "b")
    return matmul_into(ctx, out, a32, b32, op="matmul_integer")


def _conv(ctx: LowerCtx, node: OnnxNode, out: str, x: str, w: str, zx: str | None, zw: str | None,
          bias: str | None = None) -> str:
    """The int32 convolution of x and w less their zero points (w's per output channel or per tensor), through
    the Conv converter with the node's attributes, plus an int32 bias."""
    _bytes(ctx, x, w)
    x32 = _shifted(ctx, out, x, zx, 1, "x")
    w32 = _shifted(ctx, out, w, zw, 0, "w")
    conv = OnnxNode(node.name, "Conv", "", (x32, w32) + ((bias,) if bias else ()), (out,), node.attrs)
    CONVERTERS["Conv"](ctx, conv)
    return out


@register("ConvInteger")
def convert_conv_integer(ctx: LowerCtx, node: OnnxNode) -> None:
    x, w = node.inputs[:2]
    _conv(ctx, node, node.outputs[0], x, w, node.inputs[2] if ctx.has(node, 2) else None,
          node.inputs[3] if ctx.has(node, 3) else None)


def _requantize(ctx: LowerCtx, out: str, acc: str, scale: E.Expr, zero: str) -> None:
    """out = saturate(round_half_even(acc * scale) + zero) in zero's type (`scale` an fp32 expression over
    the output's indices)."""
    shape = ctx.shape(acc)
    ivars = I.out_vars(len(shape))
    if int(np.prod(ctx.shape(zero), dtype=np.int64)) != 1:
        raise ctx.unsupported(f"an output zero point of shape {list(ctx.shape(zero))} (one value)")
    dt = ctx.dtype(zero)
    z = E.cast(ctx.load(zero, tuple(I.const(0) for _ in ctx.shape(zero))), DType.F32)
    ctx.elementwise(out, shape, dt, saturated(E.mul(E.cast(ctx.load(acc, ivars), DType.F32), scale), z, dt),
                    op="requantize")


@register("QLinearConv")
def convert_qlinear_conv(ctx: LowerCtx, node: OnnxNode) -> None:
    """The integer convolution plus its int32 bias, requantized as onnxruntime does: times x_scale * w_scale
    (per output channel or tensor) / y_scale in fp32, rounded half to even, plus y's zero point, saturated."""
    x, x_scale, zx, w, w_scale, zw, y_scale, zy = node.inputs[:8]
    out = node.outputs[0]
    bias = node.inputs[8] if ctx.has(node, 8) else None
    acc = _conv(ctx, node, ctx.tmp(out, "acc"), x, w, zx, zw, bias)
    ivars = I.out_vars(len(ctx.shape(acc)))

    def f32(name: str) -> E.Expr:
        shape = ctx.shape(name)
        if int(np.prod(shape, dtype=np.int64)) == 1:
            return E.cast(ctx.load(name, tuple(I.const(0) for _ in shape)), DType.F32)
        if len(shape) == 1 and shape[0] == ctx.shape(acc)[1]:
            return E.cast(ctx.load(name, (ivars[1],)), DType.F32)
        raise ctx.unsupported(f"a scale of shape {list(shape)} (one value, or one per output channel)")

    _requantize(ctx, out, acc, E.div(E.mul(f32(x_scale), f32(w_scale)), f32(y_scale)), zy)


@register("MatMulInteger")
def convert_matmul_integer(ctx: LowerCtx, node: OnnxNode) -> None:
    a, b = node.inputs[:2]
    za = node.inputs[2] if ctx.has(node, 2) else None
    zb = node.inputs[3] if ctx.has(node, 3) else None
    _product(ctx, node, node.outputs[0], a, b, za, zb)


def _scale(ctx: LowerCtx, name: str, ivars, axis: int, what: str) -> E.Expr:
    """A scale or zero point for the output element at `ivars`: one value, or one per row (axis -2) or column
    (axis -1) of the product."""
    shape = ctx.shape(name)
    if int(np.prod(shape, dtype=np.int64)) == 1:
        return ctx.load(name, tuple(I.const(0) for _ in shape))
    if len(shape) == 1:
        return ctx.load(name, (ivars[len(ivars) + axis],))
    raise ctx.unsupported(f"a {what} of shape {list(shape)} (one value, or one per {'row' if axis == -2 else 'column'})")


@register("QLinearMatMul")
def convert_qlinear_matmul(ctx: LowerCtx, node: OnnxNode) -> None:
    """The integer product, then requantized as onnxruntime does: its int32 sum times (a_scale * b_scale) /
    y_scale in fp32, rounded half to even, plus y's zero point, saturated to y's type."""
    a, a_scale, za, b, b_scale, zb, y_scale, zy = node.inputs[:8]
    out = node.outputs[0]
    acc = _product(ctx, node, ctx.tmp(out, "acc"), a, b, za, zb)
    ivars = I.out_vars(len(ctx.shape(acc)))

    def f32(name: str, axis: int, what: str) -> E.Expr:
        return E.cast(_scale(ctx, name, ivars, axis, what), DType.F32)

    multiplier = E.div(E.mul(f32(a_scale, -2, "a_scale"), f32(b_scale, -1, "b_scale")), f32(y_scale, -1, "y_scale"))
    _requantize(ctx, out, acc, multiplier, zy)
