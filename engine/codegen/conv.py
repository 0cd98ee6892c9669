"""Direct convolution: a phase whose sum of products reads an input factor through sliding windows
(index s*o + d*k + c per spatial axis) in, the kir.Conv that stages windows and weights out.

Stride, dilation and padding come from the index expressions (codegen sees only the IR): padding is
the loads' own pad guards, evaluated when the window is staged.
"""

from __future__ import annotations

import dataclasses

from engine.codegen.kexpr import InBounds, free_vars, kwalk, map_indices, substitute_body
from engine.codegen.kir import Conv, Kernel, Phase, Scope
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.memo import memo

STAGE_BYTES = 48 * 1024  # weights + window per channel step: the static shared-memory budget of a block
MAX_MICRO = 128  # accumulators per thread (registers)
MAX_STEP = 64  # input channels per staging step
WINDOW_VARS = ("cwh", "cww")
# Vector registers a dot-product block may hold, by lanes (c0_v16: of AVX-512's 32, c0_v8: of AVX2's 16,
# c0_v4: of SSE's/NEON's 16 at least); other widths keep the window form.
DOT_REGISTERS = {16: 28, 8: 14, 4: 14}
DOT_PIXELS = 4  # pixels of one dot-product register block (more pixels per tile: several blocks)
DOT_STAGE = 16384  # floats of a tile's staged im2col pixels (a per-thread stack array)


class _NotWindow(Exception):
    pass


def conv_of(p: Phase, contraction: tuple | None, factors, threads: int) -> Conv | None:
    """The direct convolution of phase `p` ([batch, channel, rows, cols] region, batch one-wide),
    given its contraction (target, summand, vars, extents) and the summand's two factors; None when
    it is not one (the per-element loop stays)."""
    region = p.region
    if contraction is None or factors is None or region.flat or region.rank != 4 or region.extent[0] != 1 \
            or not p.dtype.is_float:
        return None
    form = conv_form(contraction, factors)
    if form is None:
        return None
    x, w, target, chan_vars, ext, tap_vars, taps, strides, dils, depthwise = form
    co, ho, wo = region.extent[1:]
    best = None
    ty = 1
    while ty <= threads:
        if threads % ty == 0:
            tx = threads // ty
            tm, tn = -(-co // ty), -(-(ho * wo) // tx)
            key = (tm * tn, tm + tn)
            if best is None or key < best[0]:
                best = (key, tm, tn, tx, ty)
        ty *= 2
    _, tm, tn, tx, ty = best
    if tm * tn > MAX_MICRO:
        return None
    chans = 1
    for v in chan_vars:
        chans *= ext[v]
    conv = Conv(x, w, target, chan_vars, tuple(ext[v] for v in chan_vars), tuple(t or "" for t in tap_vars),
                tuple(taps), tuple(strides), tuple(dils), WINDOW_VARS, depthwise, (co, ho, wo),
                ty * tm if depthwise else min(chans, MAX_STEP), tm, tn, tx, ty)
    while not depthwise and conv.bc > 1 and 4 * (conv.a_elems + conv.b_elems) > STAGE_BYTES:
        conv = dataclasses.replace(conv, bc=-(-conv.bc // 2))
    if 4 * (conv.a_elems + conv.b_elems) > STAGE_BYTES:
        return None
    return conv


def conv_form(contraction: tuple, factors) -> tuple | None:
    """`_window_form`, memoised (None also where the body is no product of two factors)."""
    if factors is None:
        return None
    return memo("conv.forms", 20000).lookup((contraction, factors), lambda: _window_form(contraction, factors))


def _window_form(contraction: tuple, factors) -> tuple | None:
    """What of `conv_of` depends on the contraction alone (memoised: a tile search builds one phase at many
    tiles): the input factor with its windows' indices, the weight, the channel and tap variables, strides and
    dilations, and whether it is depthwise; None when it reads no sliding windows."""
    target, _, names, extents = contraction
    x, w = factors
    spatial = {"i2", "i3"}
    if not free_vars(x) & spatial:
        x, w = w, x
    if not free_vars(x) & spatial or free_vars(w) & (spatial | {"i0"}):
        return None
    # Reduction axes of one step read index 0: drop them (a 1x1 conv's taps, a depthwise channel).
    unit = {v: I.const(0) for v, n in zip(names, extents) if n == 1}
    x, w = substitute_body(x, unit), substitute_body(w, unit)
    ext = {v: n for v, n in zip(names, extents) if n > 1}
    taps, tap_vars, strides, dils = [], [], [], []
    for o, win in zip(("i2", "i3"), WINDOW_VARS):
        pair = _tap_of(x, o, set(ext))
        if pair is None:
            return None
        t, s, d = pair
        k = ext.get(t, 1)
        try:
            x = map_indices(x, lambda ix, o=o, t=t, s=s, d=d, win=win: _to_window(ix, o, t, s, d, win))
        except _NotWindow:
            return None
        taps.append(k)
        tap_vars.append(t)
        strides.append(s)
        dils.append(d)
    chan_vars = tuple(v for v in names if v in ext and v not in tap_vars)
    depthwise = "i1" in free_vars(x)
    if depthwise and chan_vars:
        return None  # grouped convolution with several channels per group: not handled here
    if free_vars(x) - set(WINDOW_VARS) - set(chan_vars) - {"i0", "i1"} or \
            free_vars(w) - set(chan_vars) - set(tap_vars) - {"i1"}:
        return None
    return x, w, target, chan_vars, ext, tuple(tap_vars), tuple(taps), tuple(strides), tuple(dils), depthwise


def _indices(e) -> list[I.Lin]:
    found: list[I.Lin] = []

    def note(ix: I.Lin) -> I.Lin:
        found.append(ix)
        return ix

    map_indices(e, note)
    return found


def _var_coeffs(ix: I.Lin) -> dict[str, int]:
    return {a.name: k for a, k in ix.terms if isinstance(a, I.Var)}


def _tap_of(x, o: str, reduce_vars: set[str]) -> tuple[str | None, int, int] | None:
    """(tap variable, stride, dilation) of output axis `o`: the reduction variable added to it in the
    input factor's indices (None for a one-tap axis)."""
    for ix in _indices(x):
        coeffs = _var_coeffs(ix)
        if o not in coeffs:
            continue
        partners = [v for v in coeffs if v in reduce_vars]
        s = coeffs[o]
        if s <= 0 or len(partners) > 1:
            return None
        if not partners:
            return None, s, 1
        d = coeffs[partners[0]]
        return (partners[0], s, d) if d > 0 else None
    return None


def _to_window(ix: I.Lin, o: str, t: str | None, s: int, d: int, win: str) -> I.Lin:
    """`ix` with k*(s*o + d*t) replaced by k*win; raises _NotWindow where o and t appear otherwise."""
    co = ct = 0
    rest = []
    for atom, k in ix.terms:
        if isinstance(atom, I.Var) and atom.name == o:
            co = k
        elif t is not None and isinstance(atom, I.Var) and atom.name == t:
            ct = k
        elif {o, t} & I.atom_vars(atom):
            raise _NotWindow
        else:
            rest.append((atom, k))
    if co == 0 and ct == 0:
        return ix
    if co % s or (t is not None and co * d != ct * s):
        raise _NotWindow
    return I.Lin.make(rest + [(I.Var(win), co // s)], ix.const)


def window_interior(conv: Conv, ranges: dict, shape_of) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """Per window variable, the positions (inclusive, within `ranges`) where every padded load and
    pad guard of the input factor is inside its tensor: there the factor needs no bounds checks (the
    C printer stages those rows and columns with a vectorised loop). None where a padded index mixes
    a window variable with another variable."""
    out = {v: ranges[v] for v in conv.window_vars}
    for n in kwalk(conv.x):
        if isinstance(n, E.Load) and n.pad is not None:
            index, shape = n.index, shape_of(n.tensor)
        elif isinstance(n, InBounds):
            index, shape = n.index, n.shape
        else:
            continue
        for d, ix in enumerate(index):
            coeffs = _var_coeffs(ix)
            wins = [v for v in coeffs if v in out]
            if not wins:
                continue
            if len(ix.terms) != 1 or coeffs[wins[0]] <= 0:
                return None
            k, size = coeffs[wins[0]], shape[d]
            lo, hi = out[wins[0]]
            out[wins[0]] = (max(lo, -(ix.const // k)), min(hi, (size - 1 - ix.const) // k))
    if any(lo > hi for lo, hi in out.values()):
        return None
    return out[conv.window_vars[0]], out[conv.window_vars[1]]


def conv_dot_products(kernel: Kernel, lanes: int) -> Kernel:
    """C target pass: a dense convolution over fewer pixels per tile than `lanes` whose weight rows are
    contiguous along (input channel, tap row, tap column) — at least `lanes` of them — runs as dot
    products: each output is its weight row, read in place, times the pixel's window (the tile's
    pixels staged im2col-wise, pixel-major), `lanes` terms at a time, with `dot_channels` output
    channels x `dot_pixels` pixels of partial-sum vectors held in registers (of the DOT_REGISTERS a
    vector width leaves them, one weight vector per channel loaded beside). Taps wider than one
    stage an input element once per tap that reads it, so where windows overlap they take an input that is
    a plain load (no arithmetic repeated); a conv whose strides cover its taps (convnext's 2x2 stride-2
    downsampling, its input a LayerNorm inlined) reads each input element in one tap only. The window form vectorises along output columns (2-4 of a vector's 16
    lanes live on the last stages' 2x2 and 4x4 maps) or, with fewer pixels than a vector, along output
    channels with every channel's sums in memory: mobilenetv2's last 1x1 conv (112 -> 1280 channels
    over 2x2 pixels) took 153 us that way and 16.5 us as dot products (benchmarks/NOTES.md). At as many
    pixels as lanes (4x4) the two forms measured alike (resnet's 64-channel 3x3 convs) or the dot
    products slower (mobilenetv2's 24 -> 144 1x1 conv: one vector and a tail of eight per output)."""
    if lanes not in DOT_REGISTERS or not kernel.convs:
        return kernel
    segments = []
    for seg in kernel.segments:
        phases = []
        for p in seg.phases:
            c = p.conv
            if c is not None and _dot_shaped(kernel, p, lanes):
                pixels = min(c.out[1] * c.out[2], DOT_PIXELS)
                regs = DOT_REGISTERS[lanes]
                n = next((n for n in (8, 4, 2) if n <= c.out[0] and n * pixels + n + 1 <= regs), 1)
                p = dataclasses.replace(p, conv=dataclasses.replace(c, dot_lanes=lanes, dot_channels=n,
                                                                    dot_pixels=pixels))
            phases.append(p)
        segments.append(dataclasses.replace(seg, phases=tuple(phases)))
    return dataclasses.replace(kernel, segments=tuple(segments))


def dot_terms(c: Conv) -> int:
    """Terms of one output's dot product: input channels x taps."""
    return c.channels * c.taps[0] * c.taps[1]


def _dot_shaped(kernel: Kernel, p: Phase, lanes: int) -> bool:
    c = p.conv
    taps = c.taps[0] * c.taps[1]
    if c.depthwise or len(c.chan_vars) != 1 or dot_terms(c) < lanes or c.out[1] * c.out[2] >= lanes \
            or c.out[1] * c.out[2] * dot_terms(c) > DOT_STAGE or p.dtype != DType.F32:
        return False
    overlapping = any(s < (k - 1) * d + 1 for s, k, d in zip(c.strides, c.taps, c.dilations))
    if taps > 1 and overlapping and not (isinstance(c.x, E.Load) and all(ix.is_affine for ix in c.x.index)):
        return False  # im2col staging would repeat the input's arithmetic once per tap
    w = c.w
    if not isinstance(w, E.Load) or w.pad is not None or w.dtype != DType.F32 or not w.index:
        return False
    if kernel.buffer(w.tensor).scope != Scope.GLOBAL or not all(ix.is_affine for ix in w.index):
        return False
    # The weight's flat offset steps by one along (channel, tap row, tap column), flattened.
    want = {c.chan_vars[0]: taps, **{v: step for v, step in zip(c.tap_vars, (c.taps[1], 1)) if v}}
    return all(flat_stride(kernel, w, var) == step for var, step in want.items())


def flat_stride(kernel: Kernel, load: E.Load, var: str) -> int | None:
    """Elements `load`'s address moves when `var` steps by one; None where var sits inside a
    non-affine index term (a division, a modulo, an indirect index)."""
    buf = kernel.buffer(load.tensor)
    dims = buf.region.extent if buf.scope == Scope.BLOCK else buf.shape
    stride, total = 1, 0
    for ix, size in zip(reversed(load.index), reversed(dims)):
        for atom, coeff in ix.terms:
            if isinstance(atom, I.Var) and atom.name == var:
                total += coeff * stride
            elif var in I.atom_vars(atom):
                return None
        stride *= size
    return total
