"""Linear quantization as QDQ models write it (QuantizeLinear, DequantizeLinear): one elementwise stage each,
their scale and zero point read per tensor, per axis or per block along the axis. Computed in fp32 as ONNX
defines them — quantize rounds half to even and saturates to the integer type's range — so a QDQ model runs
its fake-quantized float graph, fused like any other (8- and 16-bit integer types; float8 and 4-bit types are
refused by their dtype)."""

from __future__ import annotations

import numpy as np

from engine.frontend.context import LowerCtx, OnnxNode, register
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType

_INTEGER = (DType.I8, DType.U8, DType.I16, DType.U16)


def _param(ctx: LowerCtx, node: OnnxNode, name: str, x_shape, ivars) -> E.Expr:
    """`name` (a scale or zero point) read for the element at `ivars` of the input of `x_shape`: one value for
    the tensor, one per index along the axis, or one per block of `block_size` indices along it."""
    shape = ctx.shape(name)
    rank = len(x_shape)
    if int(np.prod(shape, dtype=np.int64)) == 1:
        return ctx.load(name, tuple(I.const(0) for _ in shape))
    axis = ctx.axis(node, rank, 1)
    block = int(ctx.attr(node, "block_size", 0))
    if block <= 0:
        if tuple(shape) != (x_shape[axis],):
            raise ctx.unsupported(f"a {name!r} of shape {list(shape)} for an input {list(x_shape)} along axis {axis} "
                                  f"(one value, or {x_shape[axis]} along the axis, or blocks: block_size)")
        return ctx.load(name, (ivars[axis],))
    want = tuple(-(-n // block) if d == axis else n for d, n in enumerate(x_shape))
    if tuple(shape) != want:
        raise ctx.unsupported(f"a {name!r} of shape {list(shape)} for blocks of {block} along axis {axis} of "
                              f"{list(x_shape)} ({list(want)} expected)")
    return ctx.load(name, tuple(v // block if d == axis else v for d, v in enumerate(ivars)))


@register("DequantizeLinear")
def convert_dequantize(ctx: LowerCtx, node: OnnxNode) -> None:
    """y = (x - zero_point) * scale."""
    x, scale = node.inputs[:2]
    shape = ctx.shape(x)
    ivars = I.out_vars(len(shape))
    out_dt = ctx.dtype(scale)
    code = int(ctx.attr(node, "output_dtype", 0))
    if code:
        from engine.frontend.importer import dtype_of_onnx

        out_dt = dtype_of_onnx(code)
    value = E.cast(ctx.load(x, ivars), DType.F32)
    if ctx.has(node, 2):
        value = E.sub(value, E.cast(_param(ctx, node, node.inputs[2], shape, ivars), DType.F32))
    body = E.mul(value, E.cast(_param(ctx, node, scale, shape, ivars), DType.F32))
    ctx.elementwise(node.outputs[0], shape, out_dt, E.cast(body, out_dt), op="dequantize")


@register("QuantizeLinear")
def convert_quantize(ctx: LowerCtx, node: OnnxNode) -> None:
    """y = saturate(round_half_even(x / scale) + zero_point), in the zero point's type (uint8 without one, or
    output_dtype)."""
    x, scale = node.inputs[:2]
    shape = ctx.shape(x)
    ivars = I.out_vars(len(shape))
    code = int(ctx.attr(node, "output_dtype", 0))
    if ctx.has(node, 2):
        out_dt = ctx.dtype(node.inputs[2])
    elif code:
        from engine.frontend.importer import dtype_of_onnx

        out_dt = dtype_of_onnx(code)
    else:
        out_dt = DType.U8
    if out_dt not in _INTEGER:
        raise ctx.unsupported(f"quantizing to {out_dt.value} (int8, uint8, int16 or uint16)")
    scaled = E.div(E.cast(ctx.load(x, ivars), DType.F32), E.cast(_param(ctx, node, scale, shape, ivars), DType.F32))
    zero = E.cast(_param(ctx, node, node.inputs[2], shape, ivars), DType.F32) if ctx.has(node, 2) else None
    ctx.elementwise(node.outputs[0], shape, out_dt, saturated(scaled, zero, out_dt), op="quantize")


def saturated(scaled: E.Expr, zero: E.Expr | None, dtype: DType) -> E.Expr:
    """`scaled` (fp32) rounded half to even, plus `zero` (fp32; none: 0), clamped to `dtype`'s range and cast to
    it: QuantizeLinear's and the QLinear ops' requantization, as onnxruntime computes it."""
    q = E.unary("round", scaled)
    if zero is not None:
        q = E.add(q, zero)
    info = np.iinfo(dtype.np)
    q = E.binary("min", E.binary("max", q, E.imm(float(info.min), DType.F32)), E.imm(float(info.max), DType.F32))
    return E.cast(q, dtype)
