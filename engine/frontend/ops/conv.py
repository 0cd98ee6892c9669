"""Conv (1-D/2-D/3-D, groups, strides, dilations, explicit and auto pads) -> one contraction stage over
(input channel of the group, kernel taps) with halo loads reading 0, plus a bias epilogue stage."""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.frontend.context import LowerCtx, OnnxNode, register
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.graph import Combine, StageKind


@dataclass(frozen=True)
class Window:
    """Sliding-window geometry per spatial axis: output size, begin/end padding, stride, dilation."""

    out: tuple[int, ...]
    pad_begin: tuple[int, ...]
    pad_end: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]


def window_of(ctx: LowerCtx, node: OnnxNode, spatial: tuple[int, ...], kernel: tuple[int, ...], *,
              ceil_mode: bool = False) -> Window:
    """Output size and padding per the ONNX rules (auto_pad SAME_UPPER/SAME_LOWER/VALID or pads)."""
    nd = len(spatial)
    strides = tuple(int(s) for s in ctx.attr(node, "strides", [1] * nd))
    dil = tuple(int(d) for d in ctx.attr(node, "dilations", [1] * nd))
    auto = ctx.attr(node, "auto_pad", "NOTSET")
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = tuple(math.ceil(n / s) for n, s in zip(spatial, strides))
        total = [max(0, (o - 1) * s + w - n) for o, s, w, n in zip(out, strides, span, spatial)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        begin, end = (small, big) if auto == "SAME_UPPER" else (big, small)
        return Window(out, tuple(begin), tuple(end), strides, dil)
    if auto == "VALID":
        begin = end = [0] * nd
    elif auto in ("NOTSET", ""):
        pads = [int(p) for p in ctx.attr(node, "pads", [0] * (2 * nd))]
        begin, end = pads[:nd], pads[nd:]
    else:
        raise ctx.unsupported(f"auto_pad={auto}")
    out = []
    for k in range(nd):
        room = spatial[k] + begin[k] + end[k] - span[k]
        # Ceil mode admits one window wider than the padded input (ONNX: ceil(room / stride) + 1 >= 1).
        if room < 0 and not (ceil_mode and room > -strides[k]):
            raise ctx.unsupported(f"a window of {span[k]} over a padded extent of {room + span[k]}")
        o = (-(-room // strides[k]) if ceil_mode else room // strides[k]) + 1
        if ceil_mode and (o - 1) * strides[k] >= spatial[k] + begin[k]:
            o -= 1  # the last window must start inside the input or its begin padding
        out.append(o)
    return Window(tuple(out), tuple(begin), tuple(end), strides, dil)


def tap_index(w: Window, k: int, out_var: I.Lin, tap_var: I.Lin) -> I.Lin:
    """Input position read by output position `out_var` at tap `tap_var` along spatial axis k."""
    return out_var * w.strides[k] + tap_var * w.dilations[k] - w.pad_begin[k]


def has_halo(w: Window, spatial: tuple[int, ...], kernel: tuple[int, ...]) -> bool:
    """Whether some window reads outside the input (then loads need a pad value)."""
    for k, n in enumerate(spatial):
        last = (w.out[k] - 1) * w.strides[k] + (kernel[k] - 1) * w.dilations[k] - w.pad_begin[k]
        if w.pad_begin[k] > 0 or last >= n:
            return True
    return False


@register("Conv")
def convert_conv(ctx: LowerCtx, node: OnnxNode) -> None:
    x, wname = node.inputs[0], node.inputs[1]
    xs, ws = ctx.shape(x), ctx.shape(wname)
    if len(xs) < 3 or len(ws) != len(xs):
        raise ctx.unsupported(f"input of shape {xs} with weight of shape {ws}")
    n, c_in = xs[0], xs[1]
    spatial = tuple(xs[2:])
    c_out, cg = ws[0], ws[1]
    kernel = tuple(ws[2:])
    groups = int(ctx.attr(node, "group", 1))
    if c_in != cg * groups or c_out % groups:
        raise ctx.unsupported(f"group={groups} with {c_in} input and {c_out} output channels "
                              f"(weight {ws})")
    w = window_of(ctx, node, spatial, kernel)
    nd = len(spatial)
    out_shape = (n, c_out) + w.out
    ivars = I.out_vars(len(out_shape))
    rvars = I.red_vars(1 + nd)
    og = c_out // groups
    # Channel read by output channel o at reduce step c: the group's slice of the input channels.
    chan = rvars[0] if groups == 1 else I.floordiv(ivars[1], og) * cg + rvars[0]
    xidx = (ivars[0], chan) + tuple(tap_index(w, k, ivars[2 + k], rvars[1 + k]) for k in range(nd))
    pad = 0.0 if has_halo(w, spatial, kernel) else None
    body = E.mul(ctx.load(x, xidx, pad=pad), ctx.load(wname, (ivars[1],) + tuple(rvars)))
    out = node.outputs[0]
    has_bias = ctx.has(node, 2)
    target = ctx.tmp(out, "conv") if has_bias else out
    ctx.emit(target, out_shape, ctx.dtype(x), body, kind=StageKind.CONTRACTION, op="conv",
             reduce=(cg,) + kernel, combine=Combine.SUM)
    if has_bias:
        # A separate elementwise stage, so it can fuse as the contraction's epilogue.
        y = E.add(ctx.load(target, ivars), ctx.load(node.inputs[2], (ivars[1],)))
        ctx.elementwise(out, out_shape, ctx.dtype(x), y, op="bias_add")
