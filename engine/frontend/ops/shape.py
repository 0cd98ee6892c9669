"""Index-remap ops with shape parameters: Expand, Tile, Slice, Split, Pad, GatherElements, GatherND, Trilu,
ReverseSequence, OneHot, and the value generators that fold at import (ConstantOfShape, Range, EyeLike)."""

from __future__ import annotations

import numpy as np

from engine.errors import ModelError
from engine.frontend.context import LowerCtx, OnnxNode, broadcast_shapes, register, zero_of
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import StageKind


def _ints(ctx: LowerCtx, node: OnnxNode, k: int, what: str) -> list[int] | None:
    """Integer parameter given as input k (None when omitted)."""
    if not ctx.has(node, k):
        return None
    return [int(v) for v in ctx.require_const(node.inputs[k], what).ravel()]


def _layout(ctx: LowerCtx, out: str, shape, x: str, index, op: str, pad=None) -> str:
    return ctx.emit(out, tuple(shape), ctx.dtype(x), ctx.load(x, tuple(index), pad=pad),
                    kind=StageKind.LAYOUT, op=op)


@register("Expand")
def convert_expand(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    target = tuple(_ints(ctx, node, 1, "the target shape"))
    shape = broadcast_shapes(ctx.shape(x), target)
    ctx.emit(node.outputs[0], shape, ctx.dtype(x), ctx.bload(x, shape), kind=StageKind.LAYOUT, op="expand")


@register("Tile")
def convert_tile(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    reps = _ints(ctx, node, 1, "repeats")
    if len(reps) != len(shape):
        raise ctx.unsupported(f"repeats {reps} for an input of rank {len(shape)}")
    ivars = I.out_vars(len(shape))
    index = [I.mod(v, n) if r > 1 else v for v, n, r in zip(ivars, shape, reps)]
    _layout(ctx, node.outputs[0], [n * r for n, r in zip(shape, reps)], x, index, "tile")


@register("Slice")
def convert_slice(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    if ctx.opset < 10:
        starts, ends = list(node.attrs["starts"]), list(node.attrs["ends"])
        axes, steps = node.attrs.get("axes"), None
    else:
        starts, ends = _ints(ctx, node, 1, "starts"), _ints(ctx, node, 2, "ends")
        axes, steps = _ints(ctx, node, 3, "axes"), _ints(ctx, node, 4, "steps")
    axes = list(range(len(starts))) if axes is None else [a % rank for a in axes]
    steps = steps or [1] * len(starts)
    ivars = I.out_vars(rank)
    out_shape, index = list(shape), list(ivars)
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise ctx.unsupported("a slice step of 0")
        # Python's slice clamping is ONNX's (including INT_MAX/INT_MIN ends and negative steps).
        lo, _, _ = slice(s, e, st).indices(shape[a])
        out_shape[a] = len(range(*slice(s, e, st).indices(shape[a])))
        index[a] = ivars[a] * st + lo
    _layout(ctx, node.outputs[0], out_shape, x, index, "slice")


@register("Split")
def convert_split(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    axis = ctx.axis(node, len(shape), 0)
    outs = list(node.outputs)
    if ctx.opset >= 13:
        sizes = _ints(ctx, node, 1, "split")
    else:
        sizes = node.attrs.get("split")
    if not sizes:
        parts = int(ctx.attr(node, "num_outputs", len(outs)))
        chunk = -(-shape[axis] // parts)  # ceil: the last part takes the remainder (opset 18 rule)
        sizes = [min(chunk, shape[axis] - k * chunk) for k in range(parts)]
    if sum(sizes) != shape[axis] or len(sizes) != len(outs):
        raise ctx.unsupported(f"split sizes {list(sizes)} of axis {axis} (extent {shape[axis]}) "
                              f"into {len(outs)} outputs")
    ivars = I.out_vars(len(shape))
    offset = 0
    for out, size in zip(outs, sizes):
        if out:
            out_shape = list(shape)
            out_shape[axis] = size
            index = [v + offset if d == axis else v for d, v in enumerate(ivars)]
            _layout(ctx, out, out_shape, x, index, "split")
        offset += size


@register("Pad")
def convert_pad(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    mode = ctx.attr(node, "mode", "constant")
    if ctx.opset < 11:
        pads, value, axes = list(node.attrs["pads"]), float(ctx.attr(node, "value", 0.0)), None
    else:
        pads = _ints(ctx, node, 1, "pads")
        value = ctx.require_const(node.inputs[2], "the pad value").ravel()[0].item() if ctx.has(node, 2) else 0
        axes = _ints(ctx, node, 3, "axes")
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    begin, end = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begin[a], end[a] = pads[k], pads[len(axes) + k]
    ivars = I.out_vars(rank)
    out_shape = [n + b + e for n, b, e in zip(shape, begin, end)]
    index = []
    for d, (v, n, b) in enumerate(zip(ivars, shape, begin)):
        j = v - b
        if (begin[d] <= 0 and end[d] <= 0) or mode == "constant":
            index.append(j)
        elif mode == "edge":
            index.append(I.imin(I.imax(j, 0), n - 1))
        elif mode == "reflect":
            if max(begin[d], end[d]) >= n:
                raise ctx.unsupported(f"reflect padding of {max(begin[d], end[d])} on an axis of {n}")
            index.append(I.const(n - 1) - I.iabs(I.const(n - 1) - I.iabs(j)))
        elif mode == "wrap":
            index.append(I.mod(j, n))
        else:
            raise ctx.unsupported(f"mode={mode}")
    dt = ctx.dtype(x)
    pad = None
    if mode == "constant" and (any(b > 0 for b in begin) or any(e > 0 for e in end)):
        pad = bool(value) if dt == DType.BOOL else (float(value) if dt.is_float else int(value))
    _layout(ctx, node.outputs[0], out_shape, x, index, "pad", pad=pad)


@register("GatherElements")
def convert_gather_elements(ctx: LowerCtx, node: OnnxNode) -> None:
    data, idx = node.inputs[0], node.inputs[1]
    dshape, ishape = ctx.shape(data), ctx.shape(idx)
    axis = ctx.axis(node, len(dshape), 0)
    ivars = I.out_vars(len(ishape))
    sel = I.as_lin(I.Indirect(ctx.resolve(idx), tuple(ivars), dshape[axis]))
    index = [sel if d == axis else v for d, v in enumerate(ivars)]
    _layout(ctx, node.outputs[0], ishape, data, index, "gather_elements")


@register("GatherND")
def convert_gather_nd(ctx: LowerCtx, node: OnnxNode) -> None:
    """out[b.., i.., rest..] = data[b.., idx[b.., i.., 0], .., idx[b.., i.., K-1], rest..]: each of the K
    leading non-batch data axes is an Indirect read of the indices' last axis (torch's exporter writes
    one for vmap'd mask functions)."""
    data, idx = node.inputs[0], node.inputs[1]
    dshape, ishape = ctx.shape(data), ctx.shape(idx)
    b = int(ctx.attr(node, "batch_dims", 0))
    k = ishape[-1] if ishape else 0
    if not ishape or b >= len(ishape) or b + k > len(dshape) or dshape[:b] != ishape[:b]:
        raise ctx.unsupported(f"indices of shape {list(ishape)} into data of shape {list(dshape)} "
                              f"with batch_dims={b}")
    lead = len(ishape) - 1  # batch axes + gathered index axes of the output
    out_shape = ishape[:-1] + dshape[b + k:]
    ivars = I.out_vars(len(out_shape))
    src = ctx.resolve(idx)
    picked = tuple(I.as_lin(I.Indirect(src, tuple(ivars[:lead]) + (I.const(j),), dshape[b + j])) for j in range(k))
    index = tuple(ivars[:b]) + picked + tuple(ivars[lead:])
    _layout(ctx, node.outputs[0], out_shape, data, index, "gather_nd")


@register("Trilu")
def convert_trilu(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    k = _ints(ctx, node, 1, "k")
    k = k[0] if k else 0
    ivars = I.out_vars(len(shape))
    diff = E.index_val(ivars[-1] - ivars[-2])  # column - row
    keep = E.binary("ge" if int(ctx.attr(node, "upper", 1)) else "le", diff, E.imm(k, diff.dtype))
    dt = ctx.dtype(x)
    zero = E.imm(0, dt)
    ctx.elementwise(node.outputs[0], shape, dt, E.select(keep, ctx.load(x, ivars), zero), op="trilu")


@register("ConstantOfShape")
def convert_constant_of_shape(ctx: LowerCtx, node: OnnxNode) -> None:
    shape = [int(v) for v in ctx.require_const(node.inputs[0], "the shape").ravel()]
    value = node.attrs.get("value")
    value = np.zeros(1, dtype=np.float32) if value is None else np.asarray(value)
    ctx.check_const_size(node, shape, value.dtype)
    ctx.set_const(node.outputs[0], np.full(shape, value.ravel()[0], dtype=value.dtype))


@register("Range")
def convert_range(ctx: LowerCtx, node: OnnxNode) -> None:
    start, limit, delta = (ctx.require_const(n, what).reshape(()) for n, what in
                           zip(node.inputs, ("start", "limit", "delta")))
    if not delta:
        raise ModelError(f"Range node '{node.name}': delta is 0", hint="a Range needs a non-zero delta")
    count = max(int(np.ceil((limit - start) / delta)), 0)
    ctx.check_const_size(node, (count,), start.dtype)
    # ONNX defines Range by repeated addition in the input type, which arange matches.
    ctx.set_const(node.outputs[0], (start + np.arange(count, dtype=start.dtype) * delta).astype(start.dtype))


@register("EyeLike")
def convert_eye_like(ctx: LowerCtx, node: OnnxNode) -> None:
    """Ones on the k-th diagonal of a 2-D shape: a constant (shapes are static)."""
    shape = ctx.shape(node.inputs[0])
    if len(shape) != 2:
        raise ctx.unsupported(f"an input of rank {len(shape)} (2-D expected)")
    code = node.attrs.get("dtype")
    from engine.frontend.importer import dtype_of_onnx

    dt = dtype_of_onnx(int(code)) if code is not None else ctx.dtype(node.inputs[0])
    ctx.check_const_size(node, shape, dt.np)
    ctx.set_const(node.outputs[0], np.eye(shape[0], shape[1], k=int(ctx.attr(node, "k", 0)), dtype=dt.np))


@register("OneHot")
def convert_one_hot(ctx: LowerCtx, node: OnnxNode) -> None:
    """values[1] where the new axis' position equals the index (negative indices count from depth), values[0]
    elsewhere; indices of a float type are truncated to integers, as ONNX casts them."""
    idx, depth_name, values = node.inputs[:3]
    ishape = ctx.shape(idx)
    depth = ctx.require_const(depth_name, "depth").ravel()
    if depth.size != 1 or int(depth[0]) < 1:
        raise ctx.unsupported(f"depth {depth.tolist()} (one positive value)")
    n = int(depth[0])
    if ctx.shape(values) != (2,):
        raise ctx.unsupported(f"values of shape {list(ctx.shape(values))} ([off, on] expected)")
    rank = len(ishape) + 1
    axis = ctx.axis(node, rank, -1)
    ivars = I.out_vars(rank)
    at = ctx.load(idx, tuple(v for d, v in enumerate(ivars) if d != axis))
    if at.dtype != DType.I64:
        at = E.cast(at, DType.I64)
    here = E.index_val(ivars[axis])
    hot = E.binary("or", E.binary("eq", at, here), E.binary("eq", at, E.index_val(ivars[axis] - n)))
    dt = ctx.dtype(values)
    shape = tuple(ishape[:axis]) + (n,) + tuple(ishape[axis:])
    ctx.elementwise(node.outputs[0], shape, dt, E.select(hot, ctx.load(values, (I.const(1),)),
                                                         ctx.load(values, (I.const(0),))), op="one_hot")


@register("ReverseSequence")
def convert_reverse_sequence(ctx: LowerCtx, node: OnnxNode) -> None:
    """Each batch entry's first sequence_lens[b] steps reversed along the time axis, the rest kept: a gather
    whose time index is len[b] - 1 - t where t < len[b]."""
    x, lens = node.inputs[:2]
    shape = ctx.shape(x)
    b_axis, t_axis = int(ctx.attr(node, "batch_axis", 1)), int(ctx.attr(node, "time_axis", 0))
    if len(shape) < 2 or {b_axis, t_axis} != {0, 1}:
        raise ctx.unsupported(f"batch_axis {b_axis} and time_axis {t_axis} of a rank-{len(shape)} input "
                              "(0 and 1 in some order)")
    ivars = I.out_vars(len(shape))
    steps = shape[t_axis]
    length = I.as_lin(I.Indirect(ctx.resolve(lens), (ivars[b_axis],), steps + 1))
    back = length - 1 - ivars[t_axis]
    flipped = ctx.load(x, tuple(back if d == t_axis else v for d, v in enumerate(ivars)), pad=zero_of(ctx.dtype(x)))
    inside = E.binary("lt", E.index_val(ivars[t_axis]), ctx.load(lens, (ivars[b_axis],)))
    ctx.elementwise(node.outputs[0], shape, ctx.dtype(x), E.select(inside, flipped, ctx.load(x, ivars)),
                    op="reverse_sequence")
