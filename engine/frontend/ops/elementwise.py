"""Elementwise ONNX ops (with NumPy broadcasting) -> one elementwise stage each."""

from __future__ import annotations

from engine.frontend.context import LowerCtx, OnnxNode, broadcast_shapes, register
from engine.ir import expr as E
from engine.ir.dtypes import DType

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow",
           "Equal": "eq", "Greater": "gt", "GreaterOrEqual": "ge", "Less": "lt", "LessOrEqual": "le",
           "And": "and", "Or": "or", "Xor": "xor"}
_UNARY = {"Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "recip",
          "Tanh": "tanh", "Erf": "erf", "Sigmoid": "sigmoid", "Ceil": "ceil", "Floor": "floor",
          "Round": "round", "Not": "not", "Sin": "sin", "Cos": "cos", "IsNaN": "isnan", "Sign": "sign",
          "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh",
          "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh"}


def _operands(ctx: LowerCtx, node: OnnxNode, names=None):
    names = [n for n in (names or node.inputs) if n]
    shape = broadcast_shapes(*(ctx.shape(n) for n in names))
    return shape, [ctx.bload(n, shape) for n in names]


@register(*_BINARY)
def convert_binary(ctx: LowerCtx, node: OnnxNode) -> None:
    shape, (a, b) = _operands(ctx, node)
    op = _BINARY[node.op_type]
    if op == "pow" and b.dtype != a.dtype:
        b = E.cast(b, a.dtype) if not (isinstance(b, E.Imm)) else E.imm(b.value, a.dtype) if a.dtype.is_float else b
    body = E.binary(op, a, b)
    dtype = body.dtype
    ctx.elementwise(node.outputs[0], shape, dtype, body, op=op)


@register("Mod")
def convert_mod(ctx: LowerCtx, node: OnnxNode) -> None:
    shape, (a, b) = _operands(ctx, node)
    fmod = int(ctx.attr(node, "fmod", 0))
    # fmod=0 on floats is outside the spec, but the ONNX tests and onnxruntime read it as Python's
    # sign-of-divisor modulo, which is the IR's "mod".
    ctx.elementwise(node.outputs[0], shape, a.dtype, E.binary("fmod" if fmod else "mod", a, b), op="mod")


@register(*_UNARY)
def convert_unary(ctx: LowerCtx, node: OnnxNode) -> None:
    shape, (x,) = _operands(ctx, node)
    ctx.elementwise(node.outputs[0], shape, x.dtype if node.op_type not in ("Not", "IsNaN") else DType.BOOL,
                    E.unary(_UNARY[node.op_type], x), op=_UNARY[node.op_type])


@register("Min", "Max", "Sum", "Mean")
def convert_variadic(ctx: LowerCtx, node: OnnxNode) -> None:
    shape, xs = _operands(ctx, node)
    op = {"Min": "min", "Max": "max", "Sum": "add", "Mean": "add"}[node.op_type]
    body = xs[0]
    for x in xs[1:]:
        body = E.binary(op, body, x)
    if node.op_type == "Mean":
        body = E.div(body, E.imm(len(xs), body.dtype))
    ctx.elementwise(node.outputs[0], shape, body.dtype, body, op=node.op_type.lower())


@register("Where")
def convert_where(ctx: LowerCtx, node: OnnxNode) -> None:
    shape, (c, a, b) = _operands(ctx, node)
    ctx.elementwise(node.outputs[0], shape, a.dtype, E.select(c, a, b), op="where")


@register("Relu")
def convert_relu(ctx, node):
    shape, (x,) = _operands(ctx, node)
    ctx.elementwise(node.outputs[0], shape, x.dtype, E.binary("max", x, E.imm(0, x.dtype)), op="relu")


@register("LeakyRelu")
def convert_leaky_relu(ctx, node):
    shape, (x,) = _operands(ctx, node)
    alpha = E.imm(ctx.attr(node, "alpha", 0.01), x.dtype)
    zero = E.imm(0, x.dtype)
    ctx.elementwise(node.outputs[0], shape, x.dtype,
                    E.select(E.binary("ge", x, zero), x, E.mul(alpha, x)), op="leakyrelu")


@register("Elu")
def convert_elu(ctx, node):
    shape, (x,) = _operands(ctx, node)
    alpha = E.imm(ctx.attr(node, "alpha", 1.0), x.dtype)
    one, zero = E.imm(1, x.dtype), E.imm(0, x.dtype)
    neg = E.mul(alpha, E.sub(E.unary("exp", x), one))
    ctx.elementwise(node.outputs[0], shape, x.dtype, E.select(E.binary("lt", x, zero), neg, x), op="elu")


@register("Clip")
def convert_clip(ctx, node):
    x = ctx.bload(node.inputs[0], ctx.shape(node.inputs[0]))
    shape = ctx.shape(node.inputs[0])
    lo = hi = None
    if ctx.opset < 11:
        if "min" in node.attrs:
            lo = E.imm(node.attrs["min"], x.dtype)
        if "max" in node.attrs:
            hi = E.imm(node.attrs["max"], x.dtype)
    else:
        if ctx.has(node, 1):
            lo = ctx.bload(node.inputs[1], shape)
        if ctx.has(node, 2):
            hi = ctx.bload(node.inputs[2], shape)
    body = x
    if lo is not None:
        body = E.binary("max", body, lo)
    if hi is not None:
        body = E.binary("min", body, hi)
    ctx.elementwise(node.outputs[0], shape, x.dtype, body, op="clip")


@register("Cast")
def convert_cast(ctx, node):
    from engine.frontend.importer import dtype_of_onnx

    shape, (x,) = _operands(ctx, node)
    to = dtype_of_onnx(int(node.attrs["to"]))
    ctx.elementwise(node.outputs[0], shape, to, _cast_body(ctx, node, x, to), op="cast")


@register("CastLike")
def convert_cast_like(ctx, node):
    shape, (x,) = _operands(ctx, node, [node.inputs[0]])
    to = ctx.dtype(node.inputs[1])
    ctx.elementwise(node.outputs[0], shape, to, _cast_body(ctx, node, x, to), op="cast")


def _cast_body(ctx, node, x: E.Expr, to: DType) -> E.Expr:
    """ONNX Cast; to float8 with saturate=1 (the default) values clamp to the finite range first
    (inf -> max, NaN stays NaN: min/max propagate it)."""
    if x.dtype == to:
        return x
    if to.is_low_float and to != DType.BF16 and int(ctx.attr(node, "saturate", 1)) and x.dtype.is_float:
        lo, hi = to.finite_range
        x = E.binary("min", E.binary("max", x, E.imm(lo, x.dtype)), E.imm(hi, x.dtype))
    return E.cast(x, to)


@register("HardSigmoid")
def convert_hard_sigmoid(ctx, node):
    shape, (x,) = _operands(ctx, node)
    a, b = ctx.attr(node, "alpha", 0.2), ctx.attr(node, "beta", 0.5)
    y = E.add(E.mul(E.imm(a, x.dtype), x), E.imm(b, x.dtype))
    y = E.binary("min", E.binary("max", y, E.imm(0, x.dtype)), E.imm(1, x.dtype))
    ctx.elementwise(node.outputs[0], shape, x.dtype, y, op="hardsigmoid")


@register("HardSwish")
def convert_hard_swish(ctx, node):
    shape, (x,) = _operands(ctx, node)
    y = E.add(E.mul(E.imm(1 / 6, x.dtype), x), E.imm(0.5, x.dtype))
    y = E.binary("min", E.binary("max", y, E.imm(0, x.dtype)), E.imm(1, x.dtype))
    ctx.elementwise(node.outputs[0], shape, x.dtype, E.mul(x, y), op="hardswish")


@register("Softplus")
def convert_softplus(ctx, node):
    shape, (x,) = _operands(ctx, node)
    # log(1 + exp(x)) computed stably as max(x, 0) + log(1 + exp(-|x|))
    one = E.imm(1, x.dtype)
    y = E.add(E.binary("max", x, E.imm(0, x.dtype)),
              E.unary("log", E.add(one, E.unary("exp", E.unary("neg", E.unary("abs", x))))))
    ctx.elementwise(node.outputs[0], shape, x.dtype, y, op="softplus")


@register("Gelu")
def convert_gelu(ctx, node):
    shape, (x,) = _operands(ctx, node)
    t = x.dtype
    half, one = E.imm(0.5, t), E.imm(1, t)
    if ctx.attr(node, "approximate", "none") == "tanh":
        inner = E.mul(E.imm(0.7978845608028654, t),
                      E.add(x, E.mul(E.imm(0.044715, t), E.mul(x, E.mul(x, x)))))
        y = E.mul(E.mul(half, x), E.add(one, E.unary("tanh", inner)))
    else:
        y = E.mul(E.mul(half, x), E.add(one, E.unary("erf", E.mul(x, E.imm(0.7071067811865476, t)))))
    ctx.elementwise(node.outputs[0], shape, t, y, op="gelu")


@register("Identity")
def convert_identity(ctx, node):
    ctx.set_alias(node.outputs[0], node.inputs[0])


@register("Dropout")
def convert_dropout(ctx, node):
    import numpy as np

    if ctx.has(node, 2) and bool(ctx.require_const(node.inputs[2], "training_mode").ravel()[0]):
        raise ctx.unsupported("training-mode Dropout (random masks)")
    ctx.set_alias(node.outputs[0], node.inputs[0])
    if len(node.outputs) > 1 and node.outputs[1]:
        ctx.set_const(node.outputs[1], np.ones(ctx.shape(node.inputs[0]), dtype=bool))


@register("PRelu")
def convert_prelu(ctx, node):
    shape, (x, slope) = _operands(ctx, node)
    zero = E.imm(0, x.dtype)
    ctx.elementwise(node.outputs[0], shape, x.dtype, E.select(E.binary("lt", x, zero), E.mul(slope, x), x),
                    op="prelu")


@register("Selu")
def convert_selu(ctx, node):
    shape, (x,) = _operands(ctx, node)
    t = x.dtype
    alpha = E.imm(ctx.attr(node, "alpha", 1.67326319217681884765625), t)
    gamma = E.imm(ctx.attr(node, "gamma", 1.05070102214813232421875), t)
    neg = E.sub(E.mul(alpha, E.unary("exp", x)), alpha)
    y = E.mul(gamma, E.select(E.binary("gt", x, E.imm(0, t)), x, neg))
    ctx.elementwise(node.outputs[0], shape, t, y, op="selu")


@register("Celu")
def convert_celu(ctx, node):
    shape, (x,) = _operands(ctx, node)
    t = x.dtype
    alpha = float(ctx.attr(node, "alpha", 1.0))
    zero = E.imm(0, t)
    # max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
    neg = E.mul(E.imm(alpha, t), E.sub(E.unary("exp", E.mul(x, E.imm(1.0 / alpha, t))), E.imm(1, t)))
    y = E.add(E.binary("max", x, zero), E.binary("min", neg, zero))
    ctx.elementwise(node.outputs[0], shape, t, y, op="celu")


@register("ThresholdedRelu")
def convert_thresholded_relu(ctx, node):
    shape, (x,) = _operands(ctx, node)
    alpha = E.imm(ctx.attr(node, "alpha", 1.0), x.dtype)
    y = E.select(E.binary("gt", x, alpha), x, E.imm(0, x.dtype))
    ctx.elementwise(node.outputs[0], shape, x.dtype, y, op="thresholdedrelu")


@register("Softsign")
def convert_softsign(ctx, node):
    shape, (x,) = _operands(ctx, node)
    y = E.div(x, E.add(E.imm(1, x.dtype), E.unary("abs", x)))
    ctx.elementwise(node.outputs[0], shape, x.dtype, y, op="softsign")


@register("Mish")
def convert_mish(ctx, node):
    shape, (x,) = _operands(ctx, node)
    t = x.dtype
    softplus = E.add(E.binary("max", x, E.imm(0, t)),
                     E.unary("log", E.add(E.imm(1, t), E.unary("exp", E.unary("neg", E.unary("abs", x))))))
    ctx.elementwise(node.outputs[0], shape, t, E.mul(x, E.unary("tanh", softplus)), op="mish")


@register("IsInf")
def convert_is_inf(ctx, node):
    shape, (x,) = _operands(ctx, node)
    pos = E.binary("eq", x, E.imm(float("inf"), x.dtype))
    neg = E.binary("eq", x, E.imm(float("-inf"), x.dtype))
    want_pos, want_neg = int(ctx.attr(node, "detect_positive", 1)), int(ctx.attr(node, "detect_negative", 1))
    if want_pos and want_neg:
        y = E.binary("or", pos, neg)
    elif want_pos or want_neg:
        y = pos if want_pos else neg
    else:
        y = E.binary("and", pos, neg)  # never true
    ctx.elementwise(node.outputs[0], shape, DType.BOOL, y, op="isinf")


@register("Shrink")
def convert_shrink(ctx, node):
    shape, (x,) = _operands(ctx, node)
    t = x.dtype
    lambd, bias = E.imm(ctx.attr(node, "lambd", 0.5), t), E.imm(ctx.attr(node, "bias", 0.0), t)
    y = E.select(E.binary("lt", x, E.unary("neg", lambd)), E.add(x, bias),
                 E.select(E.binary("gt", x, lambd), E.sub(x, bias), E.imm(0, t)))
    ctx.elementwise(node.outputs[0], shape, t, y, op="shrink")
