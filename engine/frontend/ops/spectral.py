"""Discrete Fourier transforms (DFT, opsets 17-20; STFT, opset 17) as contractions with constant tables: each
output component (real, imaginary) sums each input component times a table of cosines or sines over the
transformed axis, one contraction stage per (output, input) component pair — tiled and fused like any other
matrix product — and one elementwise stage lays the components out on the last axis. O(n^2) per transform, as a
matrix DFT is; the tables are computed in float64 at import (n x n values each).

- forward: X[k] = sum_n x[n] e^{-2 pi i k n / N}, the input zero-padded or cut to N = dft_length; onesided keeps
  bins 0..N/2.
- inverse: x[n] = 1/N sum_k X[k] e^{+2 pi i k n / N}; inverse and onesided is numpy's irfft: the half spectrum
  extended Hermitian (bins 1..ceil(N/2)-1 counted twice, their imaginary parts at 0 and N/2 dropped), a real
  output of N samples.
- STFT: frames of frame_length every frame_step samples, times the window, each transformed (onesided by default
  for a real signal)."""

from __future__ import annotations

import numpy as np

from engine.frontend.context import LowerCtx, OnnxNode, register
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine, StageKind


def _scalar(ctx: LowerCtx, node: OnnxNode, k: int, what: str) -> int | None:
    if not ctx.has(node, k):
        return None
    value = ctx.require_const(node.inputs[k], what).ravel()
    if value.size != 1:
        raise ctx.unsupported(f"{what} of {value.size} values (one expected)")
    return int(value[0])


def _tables(n: int, taken: int, bins: int, inverse: bool, halfspectrum: bool) -> dict[tuple[int, int], np.ndarray]:
    """{(output component, input component): [bins, taken] table} of a transform of length `n` reading `taken`
    input positions and writing `bins` outputs (components: 0 real, 1 imaginary)."""
    k = np.arange(bins)[:, None].astype(np.float64)
    m = np.arange(taken)[None, :].astype(np.float64)
    if halfspectrum:  # irfft: output sample k from half-spectrum bin m
        theta = 2 * np.pi * k * m / n
        weight = np.where((m == 0) | ((n % 2 == 0) & (m == n // 2)), 1.0, 2.0) / n
        weight = np.where(m > n // 2, 0.0, weight)
        return {(0, 0): weight * np.cos(theta), (0, 1): -weight * np.sin(theta)}
    theta = 2 * np.pi * k * m / n
    c, s = np.cos(theta), np.sin(theta)
    if inverse:  # (a + ib)(cos + i sin) / n
        return {(0, 0): c / n, (0, 1): -s / n, (1, 0): s / n, (1, 1): c / n}
    return {(0, 0): c, (0, 1): s, (1, 0): -s, (1, 1): c}  # (a + ib)(cos - i sin)


def _transform(ctx: LowerCtx, out: str, x: str, axis: int, tables: dict, bins: int, taken: int, parts: int,
               window: str | None = None) -> None:
    """out[..., bins at axis, ..., parts] = the components' contractions over the first `taken` positions along
    `axis` of x ([..., 1 or 2]); `window`: a tensor of `taken` values multiplying each term."""
    shape = ctx.shape(x)
    dt = ctx.dtype(x)
    comps = shape[-1]
    body_shape = tuple(bins if d == axis else s for d, s in enumerate(shape[:-1]))
    ivars = I.out_vars(len(body_shape))
    r = I.var("r0")
    sums = {}
    for (o, i), table in tables.items():
        if i >= comps:
            continue
        name = ctx.fresh(f"{out}::dft{o}{i}")
        ctx.set_const(name, table.astype(dt.np))
        at = tuple(r if d == axis else v for d, v in enumerate(ivars))
        term = ctx.load(x, at + (I.const(i),))
        if window is not None:
            term = E.mul(term, ctx.load(window, (r,)))
        body = E.mul(term, ctx.load(name, (ivars[axis], r)))
        sums.setdefault(o, []).append(ctx.emit(ctx.tmp(out, f"part{o}{i}"), body_shape, dt, body,
                                               kind=StageKind.CONTRACTION, op="dft", reduce=(taken,),
                                               combine=Combine.SUM))
    ovars = I.out_vars(len(body_shape) + 1)
    values = []
    for o in range(parts):
        total = None
        for s in sums.get(o, []):
            v = ctx.load(s, ovars[:-1])
            total = v if total is None else E.add(total, v)
        values.append(total if total is not None else E.imm(0.0, dt))
    value = values[0] if parts == 1 else E.select(E.binary("eq", E.index_val(ovars[-1]), E.imm(0, DType.I64)),
                                                  values[0], values[1])
    ctx.elementwise(out, body_shape + (parts,), dt, value, op="dft")


@register("DFT")
def convert_dft(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    if rank < 2 or shape[-1] not in (1, 2):
        raise ctx.unsupported(f"an input of shape {list(shape)} (a last axis of 1: real, or 2: complex)")
    if ctx.opset >= 20:
        given = _scalar(ctx, node, 2, "axis")
        axis = -2 if given is None else given
    else:
        axis = int(ctx.attr(node, "axis", 1))
    if not -rank <= axis < rank or axis % rank == rank - 1:
        raise ctx.unsupported(f"axis {axis} of a rank-{rank} input (not its last, the components' axis)")
    axis %= rank
    inverse, onesided = bool(int(ctx.attr(node, "inverse", 0))), bool(int(ctx.attr(node, "onesided", 0)))
    length = shape[axis]
    n = _scalar(ctx, node, 1, "dft_length")
    if n is None:
        n = 2 * (length - 1) if inverse and onesided else length
    if n < 1:
        raise ctx.unsupported(f"dft_length {n} (at least 1)")
    if inverse and onesided:
        taken, bins, parts = min(length, n // 2 + 1), n, 1
    else:
        taken, bins, parts = min(length, n), (n // 2 + 1 if onesided else n), 2
    _transform(ctx, node.outputs[0], x, axis, _tables(n, taken, bins, inverse, inverse and onesided), bins, taken,
               parts)


@register("STFT")
def convert_stft(ctx: LowerCtx, node: OnnxNode) -> None:
    signal = node.inputs[0]
    shape = ctx.shape(signal)
    if len(shape) != 3 or shape[-1] not in (1, 2):
        raise ctx.unsupported(f"a signal of shape {list(shape)} ([batch, samples, 1 or 2])")
    step = _scalar(ctx, node, 1, "frame_step")
    window = node.inputs[2] if ctx.has(node, 2) else None
    length = _scalar(ctx, node, 3, "frame_length")
    if length is None:
        if window is None:
            raise ctx.unsupported("neither a window nor a frame_length")
        length = ctx.shape(window)[0]
    if window is not None and ctx.shape(window) != (length,):
        raise ctx.unsupported(f"a window of shape {list(ctx.shape(window))} for frames of {length}")
    if step is None or step < 1 or not 1 <= length <= shape[1]:
        raise ctx.unsupported(f"frame_step {step} and frame_length {length} for {shape[1]} samples")
    onesided = bool(int(ctx.attr(node, "onesided", 1)))
    if onesided and shape[-1] == 2:
        raise ctx.unsupported("onesided output of a complex signal")
    frames = 1 + (shape[1] - length) // step
    bins = length // 2 + 1 if onesided else length
    tables = _tables(length, length, bins, False, False)
    values = ctx.const(window) if window is not None else None
    if values is not None:  # a constant window folds into the tables
        tables = {key: t * values.astype(np.float64)[None, :] for key, t in tables.items()}
    out = node.outputs[0]
    # Frames as a gather of the signal: [batch, frames, samples per frame, components]; the transform's axis 2.
    framed = ctx.emit(ctx.tmp(out, "frames"), (shape[0], frames, length, shape[-1]), ctx.dtype(signal),
                      ctx.load(signal, (I.var("i0"), I.var("i1") * step + I.var("i2"), I.var("i3"))),
                      kind=StageKind.LAYOUT, op="stft.frames")
    _transform(ctx, out, framed, 2, tables, bins, length, 2, window=window if values is None else None)
