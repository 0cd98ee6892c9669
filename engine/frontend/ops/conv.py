"""Conv (1-D/2-D/3-D, groups, strides, dilations, explicit and auto pads) -> one contraction stage over
(input channel of the group, kernel taps) with halo loads reading 0, plus a bias epilogue stage.
ConvTranspose -> one such conv stage per output residue class (the taps that reach it, none of the
inserted zeros) and a layout stage interleaving them."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from engine.frontend.context import LowerCtx, OnnxNode, register, zero_of
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
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
    begin, end = explicit_pads(ctx, node, nd)
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


def explicit_pads(ctx: LowerCtx, node: OnnxNode, nd: int) -> tuple[list[int], list[int]]:
    """(begin, end) padding per spatial axis where auto_pad is VALID, NOTSET or absent (the `pads` attribute)."""
    auto = ctx.attr(node, "auto_pad", "NOTSET")
    if auto == "VALID":
        return [0] * nd, [0] * nd
    if auto not in ("NOTSET", ""):
        raise ctx.unsupported(f"auto_pad={auto}")
    pads = [int(p) for p in ctx.attr(node, "pads", [0] * (2 * nd))]
    return pads[:nd], pads[nd:]


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


def _operands(ctx: LowerCtx, node: OnnxNode) -> tuple[str, str, tuple[int, ...], tuple[int, ...]]:
    """(input, weight, their shapes) of a Conv or ConvTranspose: a batch, channels and a spatial axis at least,
    and a weight of the same rank."""
    x, wname = node.inputs[0], node.inputs[1]
    xs, ws = ctx.shape(x), ctx.shape(wname)
    if len(xs) < 3 or len(ws) != len(xs):
        raise ctx.unsupported(f"input of shape {xs} with weight of shape {ws}")
    return x, wname, xs, ws


@register("Conv")
def convert_conv(ctx: LowerCtx, node: OnnxNode) -> None:
    x, wname, xs, ws = _operands(ctx, node)
    n, c_in, spatial = xs[0], xs[1], tuple(xs[2:])
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
    pad = zero_of(ctx.dtype(x)) if has_halo(w, spatial, kernel) else None
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


@dataclass(frozen=True)
class _Phase:
    """One output residue class of a transposed conv along one axis: the kernel taps that reach it, in
    the order the phase conv runs them, and the input offset of its first tap."""

    taps: tuple[int, ...]  # kernel positions, last-reaching first (the phase conv's tap 0 reads the lowest input)
    offset: int  # input position read by phase output 0 at phase tap 0
    step: int  # input positions between consecutive phase taps (the phase conv's dilation)


def transposed_phases(stride: int, dilation: int, kernel: int, pad_begin: int) -> list[_Phase]:
    """Per output residue r (output o = stride*q + r): a transposed conv adds x[i] * w[k] into
    o = stride*i + dilation*k - pad_begin, so o's residue is reached by the taps k with
    (r + pad_begin - dilation*k) divisible by stride, each from input i = q + (r + pad_begin - dilation*k) / stride.
    Run with those taps reversed, each residue class is a plain (correlation) conv over q with stride 1,
    dilation dilation/gcd and a constant offset: no multiply-add by an inserted zero."""
    out = []
    for r in range(stride):
        taps = [k for k in range(kernel) if (r + pad_begin - dilation * k) % stride == 0]
        taps.reverse()
        offset = (r + pad_begin - dilation * taps[0]) // stride if taps else 0
        out.append(_Phase(tuple(taps), offset, dilation // math.gcd(stride, dilation)))
    return out


@register("ConvTranspose")
def convert_conv_transpose(ctx: LowerCtx, node: OnnxNode) -> None:
    """ConvTranspose (1-D/2-D/3-D, groups, strides, dilations, pads, output_padding, output_shape, auto_pad)
    -> per output residue class (stride_h x stride_w ... of them) one plain conv stage over the taps that reach
    it (`transposed_phases`: the weight read in place through its index, reversed along the taps), and one
    layout stage interleaving them; a bias is its own epilogue stage, as Conv's."""
    x, wname, xs, ws = _operands(ctx, node)
    n, c_in, spatial = xs[0], xs[1], tuple(xs[2:])
    nd = len(spatial)
    groups = int(ctx.attr(node, "group", 1))
    og = ws[1]
    kernel = tuple(int(k) for k in ctx.attr(node, "kernel_shape", ws[2:]))
    if ws[0] != c_in or c_in % groups or kernel != tuple(ws[2:]):
        raise ctx.unsupported(f"group={groups} and kernel_shape {list(kernel)} with {c_in} input channels and "
                              f"weight {ws} (want [C_in, C_out/group, k...])")
    cg, c_out = c_in // groups, og * groups
    strides = tuple(int(s) for s in ctx.attr(node, "strides", [1] * nd))
    dil = tuple(int(d) for d in ctx.attr(node, "dilations", [1] * nd))
    extra = tuple(int(p) for p in ctx.attr(node, "output_padding", [0] * nd))
    if any(e >= max(s, d) for e, s, d in zip(extra, strides, dil)) or min(strides + dil) < 1:
        raise ctx.unsupported(f"strides {list(strides)}, dilations {list(dil)} with output_padding {list(extra)}")
    full = [s * (i - 1) + e + (k - 1) * d + 1 for s, i, e, k, d in zip(strides, spatial, extra, kernel, dil)]
    auto = ctx.attr(node, "auto_pad", "NOTSET")
    wanted = ctx.attr(node, "output_shape", None)
    if wanted is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = [int(v) for v in wanted][-nd:] if wanted is not None else [i * s for i, s in zip(spatial, strides)]
        # ONNX: the padding that gives that shape (negative: rows past the full output, reading zeros), split
        # with the odd one at the end for SAME_UPPER, at the beginning otherwise.
        total = [f - t for f, t in zip(full, target)]
        upper = auto == "SAME_UPPER"
        begin = [t // 2 if upper else t - t // 2 for t in total]
        end = [t - b for t, b in zip(total, begin)]
    else:
        begin, end = explicit_pads(ctx, node, nd)
    out_sp = tuple(f - b - e for f, b, e in zip(full, begin, end))
    if min(out_sp) < 1:
        raise ctx.unsupported(f"pads {begin + end} that leave an output of {list(out_sp)}")
    phases = [transposed_phases(s, d, k, b) for s, d, k, b in zip(strides, dil, kernel, begin)]
    qs = tuple(-(-o // s) for o, s in zip(out_sp, strides))  # phase outputs: every residue's rows, at most
    out = node.outputs[0]
    dtype = ctx.dtype(x)
    ivars = I.out_vars(2 + nd)
    made: dict[tuple[int, ...], E.Expr] = {}
    has_bias = ctx.has(node, 2)
    target = ctx.tmp(out, "convt") if has_bias else out
    alone = all(s == 1 for s in strides)  # one residue class: its conv is the output
    rv = I.red_vars(1 + nd)
    # Output channel o = group g, channel oo in it; input channel g*cg + c. Weight [C_in, C_out/g, k...].
    chan = I.floordiv(ivars[1], og) * cg + rv[0] if groups > 1 else rv[0]
    wch = I.mod(ivars[1], og) if groups > 1 else ivars[1]
    for residues in itertools.product(*[range(min(s, o)) for s, o in zip(strides, out_sp)]):
        ph = [phases[k][r] for k, r in enumerate(residues)]
        if any(not p.taps for p in ph):
            continue  # no tap reaches this residue class: zeros (plus the bias)
        taps = tuple(len(p.taps) for p in ph)
        xidx = [ivars[0], chan]
        widx = [chan, wch]
        halo = False
        for k, p in enumerate(ph):
            t = rv[1 + k]
            xidx.append(ivars[2 + k] + t * p.step + p.offset)
            last = (qs[k] - 1) + (len(p.taps) - 1) * p.step + p.offset
            halo = halo or p.offset < 0 or last >= spatial[k]
            # Tap j of the phase is kernel position taps[j] = taps[0] - j * (kernel step between them).
            kstep = (p.taps[0] - p.taps[1]) if len(p.taps) > 1 else 0
            widx.append(t * (-kstep) + p.taps[0])
        body = E.mul(ctx.load(x, tuple(xidx), pad=0.0 if halo else None), ctx.load(wname, tuple(widx)))
        name = target if alone else ctx.tmp(out, "phase" + "".join(map(str, residues)))
        ctx.emit(name, (n, c_out) + qs, dtype, body, kind=StageKind.CONTRACTION, op="conv",
                 reduce=(cg,) + taps, combine=Combine.SUM)
        made[residues] = ctx.load(name, (ivars[0], ivars[1]) + tuple(
            I.floordiv(ivars[2 + k], s) if s > 1 else ivars[2 + k] for k, s in enumerate(strides)))
    zero = E.imm(0.0, dtype)
    if not alone:
        body = _interleave(made, strides, out_sp, ivars, zero) if made else zero
        ctx.emit(target, (n, c_out) + out_sp, dtype, body, kind=StageKind.LAYOUT, op="conv_transpose")
    if has_bias:
        y = E.add(ctx.load(target, ivars), ctx.load(node.inputs[2], (ivars[1],)))
        ctx.elementwise(out, (n, c_out) + out_sp, dtype, y, op="bias_add")


def _interleave(made: dict, strides: tuple[int, ...], out_sp: tuple[int, ...], ivars, zero: E.Expr,
                prefix: tuple[int, ...] = ()) -> E.Expr:
    """The phase an output element belongs to, chosen axis by axis by its residue (a select chain)."""
    k = len(prefix)
    if k == len(strides):
        return made.get(prefix, zero)
    s = strides[k]
    arms = [_interleave(made, strides, out_sp, ivars, zero, prefix + (r,)) for r in range(min(s, out_sp[k]))]
    if len(arms) == 1:
        return arms[0]
    residue = E.index_val(I.mod(ivars[2 + k], s))
    body = arms[-1]
    for r in range(len(arms) - 2, -1, -1):
        body = E.select(E.binary("eq", residue, E.imm(r, DType.I64)), arms[r], body)
    return body
