"""Layout ops: pure index remaps (transpose, reshape family, concat, gather, ...) and the shape ops
that fold to constants at import (Shape, Constant, ...)."""

from __future__ import annotations

import numpy as np

from engine.errors import ModelError
from engine.frontend.context import LowerCtx, OnnxNode, register, zero_of
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import StageKind


def strides_of(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def reshape_index(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> tuple[I.Lin, ...]:
    """Index into a row-major tensor of `in_shape` for output position i of `out_shape`."""
    ivars = I.out_vars(len(out_shape))
    ranges = {f"i{k}": (0, n - 1) for k, n in enumerate(out_shape)}
    flat = I.const(0)
    for v, s in zip(ivars, strides_of(out_shape)):
        flat = flat + v * s
    index = []
    for n, s in zip(in_shape, strides_of(in_shape)):
        e = I.floordiv(flat, s, ranges) if s > 1 else flat
        e = I.simplify(e, ranges)
        index.append(I.simplify(I.mod(e, n, ranges), ranges) if n > 1 else I.const(0))
    return tuple(index)


def reshape_to(ctx: LowerCtx, out: str, x: str, shape: tuple[int, ...]) -> str:
    in_shape = ctx.shape(x)
    if int(np.prod(in_shape)) != int(np.prod(shape)):
        raise ctx.unsupported(f"reshape of {in_shape} ({int(np.prod(in_shape))} elements) to {shape}")
    if tuple(in_shape) == tuple(shape):
        ctx.set_alias(out, x)
        return out
    value = ctx.const(x)
    if value is not None:
        ctx.set_const(out, value.reshape(shape))
        return out
    ctx.emit(out, shape, ctx.dtype(x), ctx.load(x, reshape_index(in_shape, shape)),
             kind=StageKind.LAYOUT, op="reshape")
    return out


@register("Reshape")
def convert_reshape(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    in_shape = ctx.shape(x)
    if ctx.opset < 5:
        target = list(node.attrs["shape"])
    else:
        target = [int(v) for v in ctx.require_const(node.inputs[1], "the target shape").ravel()]
    allowzero = int(ctx.attr(node, "allowzero", 0))
    shape = []
    for k, d in enumerate(target):
        shape.append(in_shape[k] if d == 0 and not allowzero else d)
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        shape[shape.index(-1)] = int(np.prod(in_shape)) // max(known, 1)
    reshape_to(ctx, node.outputs[0], x, tuple(shape))


@register("Flatten")
def convert_flatten(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    axis = int(ctx.attr(node, "axis", 1))
    if not -len(shape) <= axis <= len(shape):
        raise ModelError(f"Flatten node '{node.name}': axis={axis} is out of range for a rank-{len(shape)} input",
                         hint=f"use {-len(shape)}..{len(shape)}")
    axis = axis + len(shape) if axis < 0 else axis  # -1 is the last axis, not the rank
    reshape_to(ctx, node.outputs[0], x, (int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))))


@register("Squeeze")
def convert_squeeze(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    if ctx.opset >= 13:
        axes = [int(a) for a in ctx.require_const(node.inputs[1], "axes").ravel()] if ctx.has(node, 1) else None
    else:
        axes = node.attrs.get("axes")
    if axes is None:
        axes = [k for k, d in enumerate(shape) if d == 1]
    axes = {a % len(shape) for a in axes}
    reshape_to(ctx, node.outputs[0], x, tuple(d for k, d in enumerate(shape) if k not in axes))


@register("Unsqueeze")
def convert_unsqueeze(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = list(ctx.shape(x))
    if ctx.opset >= 13:
        axes = [int(a) for a in ctx.require_const(node.inputs[1], "axes").ravel()]
    else:
        axes = list(node.attrs["axes"])
    rank = len(shape) + len(axes)
    for a in sorted(a % rank for a in axes):
        shape.insert(a, 1)
    reshape_to(ctx, node.outputs[0], x, tuple(shape))


@register("Transpose")
def convert_transpose(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    perm = [int(p) for p in ctx.attr(node, "perm", list(range(len(shape)))[::-1])]
    if sorted(perm) != list(range(len(shape))):
        raise ModelError(f"Transpose node '{node.name}': perm={perm} is not a permutation of the input's "
                         f"{len(shape)} axes", hint=f"give each of 0..{len(shape) - 1} once")
    out_shape = tuple(shape[p] for p in perm)
    index = [None] * len(shape)
    for k, p in enumerate(perm):
        index[p] = I.var(f"i{k}")
    ctx.emit(node.outputs[0], out_shape, ctx.dtype(x), ctx.load(x, tuple(index)),
             kind=StageKind.LAYOUT, op="transpose")


@register("Shape")
def convert_shape(ctx: LowerCtx, node: OnnxNode) -> None:
    shape = ctx.shape(node.inputs[0])
    rank = len(shape)
    start = int(ctx.attr(node, "start", 0))
    end = ctx.attr(node, "end", None)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = rank if end is None else max(0, min(rank, int(end) + rank if int(end) < 0 else int(end)))
    ctx.set_const(node.outputs[0], np.array(shape[start:end], dtype=np.int64))


@register("Size")
def convert_size(ctx: LowerCtx, node: OnnxNode) -> None:
    ctx.set_const(node.outputs[0], np.array(int(np.prod(ctx.shape(node.inputs[0]))), dtype=np.int64))


@register("Constant")
def convert_constant(ctx: LowerCtx, node: OnnxNode) -> None:
    a = node.attrs
    if "value" in a:
        v = np.asarray(a["value"])
    elif "value_float" in a:
        v = np.array(a["value_float"], dtype=np.float32)
    elif "value_floats" in a:
        v = np.array(a["value_floats"], dtype=np.float32)
    elif "value_int" in a:
        v = np.array(a["value_int"], dtype=np.int64)
    elif "value_ints" in a:
        v = np.array(a["value_ints"], dtype=np.int64)
    else:
        raise ctx.unsupported("a Constant without a tensor/float/int value")
    ctx.set_const(node.outputs[0], v)


@register("Concat")
def convert_concat(ctx: LowerCtx, node: OnnxNode) -> None:
    names = [n for n in node.inputs if n and 0 not in ctx.shape(n)] or [node.inputs[0]]
    rank = len(ctx.shape(names[0]))
    axis = ctx.axis(node, rank)
    shape = list(ctx.shape(names[0]))
    shape[axis] = sum(ctx.shape(n)[axis] for n in names)
    ivars = I.out_vars(rank)
    # Guarded loads: outside its slice each operand reads `pad`, and a select picks the owner.
    body = None
    offsets = []
    acc = 0
    for n in names:
        offsets.append(acc)
        acc += ctx.shape(n)[axis]
    dtype = ctx.dtype(names[0])
    for n, off in reversed(list(zip(names, offsets))):
        index = tuple(v - off if d == axis else v for d, v in enumerate(ivars))
        ld = ctx.load(n, index, pad=zero_of(dtype)) if len(names) > 1 else ctx.load(n, index)
        if body is None:
            body = ld
        else:
            cond = E.binary("lt", E.index_val(ivars[axis]), E.imm(offsets[names.index(n) + 1], DType.I64))
            body = E.select(cond, ld, body)
    ctx.emit(node.outputs[0], tuple(shape), dtype, body, kind=StageKind.LAYOUT, op="concat")


@register("Gather")
def convert_gather(ctx: LowerCtx, node: OnnxNode) -> None:
    data, idx = node.inputs[0], node.inputs[1]
    dshape, ishape = ctx.shape(data), ctx.shape(idx)
    axis = ctx.axis(node, len(dshape), 0)
    out_shape = dshape[:axis] + ishape + dshape[axis + 1:]
    ivars = I.out_vars(len(out_shape))
    ivalue = ctx.const(idx)
    if ivalue is not None and ivalue.size and not ((ivalue >= -dshape[axis]) & (ivalue < dshape[axis])).all():
        bad = int(ivalue.ravel()[np.argmax((ivalue < -dshape[axis]) | (ivalue >= dshape[axis]))])
        raise ModelError(f"Gather node '{node.name}': constant index {bad} is out of range for axis {axis} of "
                         f"size {dshape[axis]}", hint=f"indices must lie in {-dshape[axis]}..{dshape[axis] - 1}")
    if ivalue is not None and ivalue.size == 1:
        k = int(ivalue.ravel()[0])
        k = k + dshape[axis] if k < 0 else k
        sel = I.const(k)
    else:
        sel = I.as_lin(I.Indirect(ctx.resolve(idx), tuple(ivars[axis:axis + len(ishape)]), dshape[axis]))
    index = tuple(ivars[:axis]) + (sel,) + tuple(ivars[axis + len(ishape):])
    ctx.emit(node.outputs[0], out_shape, ctx.dtype(data), ctx.load(data, index), kind=StageKind.LAYOUT,
             op="gather")


@register("DepthToSpace", "SpaceToDepth")
def convert_depth_space(ctx: LowerCtx, node: OnnxNode) -> None:
    """Pixel shuffle and unshuffle as one index map each: DepthToSpace moves blocksize^2 channel groups into
    blocksize x blocksize spatial blocks (DCR: the block offset is the channel's high part; CRD: its low
    part), SpaceToDepth the reverse."""
    x = node.inputs[0]
    shape = ctx.shape(x)
    if len(shape) != 4:
        raise ctx.unsupported(f"an input of rank {len(shape)} (NCHW expected)")
    b = int(node.attrs.get("blocksize", 0))
    mode = ctx.attr(node, "mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if b < 1 or mode not in ("DCR", "CRD"):
        raise ctx.unsupported(f"blocksize {b} with mode {mode} (a blocksize of at least 1, DCR or CRD)")
    n, c, h, w = shape
    if node.op_type == "DepthToSpace":
        if c % (b * b):
            raise ctx.unsupported(f"{c} channels for blocksize {b} (a multiple of {b * b} expected)")
        out_shape = (n, c // (b * b), h * b, w * b)
    else:
        if h % b or w % b:
            raise ctx.unsupported(f"spatial size {h}x{w} for blocksize {b} (multiples of it expected)")
        out_shape = (n, c * b * b, h // b, w // b)
    o = I.out_vars(4)
    ranges = {f"i{k}": (0, d - 1) for k, d in enumerate(out_shape)}
    fd = lambda e, k: I.floordiv(e, k, ranges)  # noqa: E731
    md = lambda e, k: I.mod(e, k, ranges)  # noqa: E731
    if node.op_type == "DepthToSpace":
        cout = out_shape[1]
        bh, bw = md(o[2], b), md(o[3], b)
        chan = (bh * b + bw) * cout + o[1] if mode == "DCR" else o[1] * (b * b) + bh * b + bw
        index = (o[0], chan, fd(o[2], b), fd(o[3], b))
    else:
        if mode == "DCR":
            blk, chan = fd(o[1], c), md(o[1], c)
        else:
            blk, chan = md(o[1], b * b), fd(o[1], b * b)
        index = (o[0], chan, o[2] * b + fd(blk, b), o[3] * b + md(blk, b))
    ctx.emit(node.outputs[0], out_shape, ctx.dtype(x), ctx.load(x, index), kind=StageKind.LAYOUT,
             op=node.op_type.lower())
