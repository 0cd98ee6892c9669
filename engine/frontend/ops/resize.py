"""Resize (opsets 10-19) and the older Upsample -> a layout stage per axis with several taps (innermost first),
the one-tap axes in the first (nearest: one stage). Per resized axis the importer works out,
for every output position, which input positions it reads and with what weights (the ONNX reference's own
rules: coordinate transformation, nearest rounding, linear and cubic coefficients, edge padding,
exclude_outside); the stage sums the products of the axes' weights times the input read there. A position
table that is an affine map of the output position (integer up- and down-sampling) becomes that index,
clamped; any other is read through a constant int64 table (a gather), and weights that vary along the axis
through a constant float table."""

from __future__ import annotations

import itertools
import math

import numpy as np

from engine.frontend.context import LowerCtx, OnnxNode, register
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import StageKind

# A Resize with several taps on more than one axis: one stage per such axis (False: one stage summing every
# combination of taps, kept for benchmarks/bench_resize.py's comparison; 3.3x slower on unet's upsampling).
SEPARABLE = True

COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def source_coords(mode: str, n_in: int, n_out: int, scale: float) -> np.ndarray:
    """The input coordinate of each output position (ONNX's coordinate_transformation_mode). As in the ONNX
    reference, align_corners spans the unrounded output length `scale * n_in` (the given scale, not the
    output size it rounds to)."""
    x = np.arange(n_out, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = n_out / (scale * n_in)
        offset = n_in / 2 * (1 - adjustment)
        return offset + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(x)
    if mode == "align_corners":
        return x * (n_in - 1) / (scale * n_in - 1) if n_out > 1 else np.zeros_like(x)
    return x / scale  # asymmetric


def nearest_taps(coords: np.ndarray, n_in: int, rounding: str) -> tuple[np.ndarray, np.ndarray]:
    if rounding == "round_prefer_floor":
        idx = np.ceil(coords - 0.5)
    elif rounding == "round_prefer_ceil":
        idx = np.floor(coords + 0.5)
    elif rounding == "floor":
        idx = np.floor(coords)
    else:
        idx = np.ceil(coords)
    idx = np.clip(idx, 0, n_in - 1).astype(np.int64)
    return idx[:, None], np.ones((len(coords), 1))


def _kernel(t: float, cubic: float | None) -> float:
    """The linear (triangle) or cubic (Keys, coefficient `cubic`) interpolation kernel at distance t."""
    t = abs(t)
    if cubic is None:
        return max(0.0, 1 - t)
    a = cubic
    if t <= 1:
        return ((a + 2) * t - (a + 3)) * t * t + 1
    return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a if t < 2 else 0.0


def filter_taps(coords: np.ndarray, n_in: int, cubic: float | None, exclude_outside: bool,
                antialias_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights), each [n_out, taps]: linear (2 taps) or cubic (4, coefficient `cubic`) as the ONNX
    reference computes them — the taps nearest the coordinate, positions outside the input reading the edge
    (or, `exclude_outside`, weighing nothing, the rest renormalised). `antialias_scale` (< 1: antialiased
    downsampling) widens the filter by its inverse, its weights normalised to sum 1."""
    reach = 1 if cubic is None else 2
    first_tap = math.floor(-reach / antialias_scale) + 1 if antialias_scale < 1 else 1 - reach
    n = 2 - 2 * first_tap
    idx = np.zeros((len(coords), n), np.int64)
    wts = np.zeros((len(coords), n))
    for o, x in enumerate(coords):
        base = math.floor(x)
        ratio = x - base
        if ratio == 0 and antialias_scale < 1:  # the reference's taps: from the one below, weighing 0 here
            base, ratio = base - 1, 1.0
        # (Without antialiasing that tap weighs nothing either way: the taps from `base` keep the index
        # tables affine in the output position where the scale is rational.)
        if antialias_scale < 1:
            coeffs = [_kernel(antialias_scale * (i - ratio), cubic) for i in range(first_tap, 2 - first_tap)]
            coeffs = [c / sum(coeffs) for c in coeffs]
        else:
            coeffs = [_kernel(t, cubic) for t in ((ratio, 1 - ratio) if cubic is None else
                                                  (ratio + 1, ratio, 1 - ratio, 2 - ratio))]
        first = base - (n // 2 - 1)
        taps = np.arange(first, first + n)
        c = np.asarray(coeffs, np.float64)
        if exclude_outside:
            c = np.where((taps >= 0) & (taps < n_in), c, 0.0)
            c = c / c.sum() if c.sum() else c
        idx[o] = np.clip(taps, 0, n_in - 1)
        wts[o] = c
    return idx, wts


def affine_index(table: np.ndarray, n_in: int, var: I.Lin) -> I.Lin | None:
    """`table` (input position per output position) as (a*o + c) // d for the output-to-input ratio a/d of
    the axis, clamped to the table's own least and greatest position (edge taps), or None."""
    n_out = len(table)
    o = np.arange(n_out)
    g = math.gcd(n_in, n_out)
    a, d = n_in // g, n_out // g
    if a > 64 or d > 64:
        return None
    lo, hi = int(table.min()), int(table.max())
    for c in range(-2 * d * max(1, a), 2 * d * max(1, a) + 1):
        plain = (a * o + c) // d
        if np.array_equal(np.clip(plain, lo, hi), table):
            lin = I.floordiv(var * a + c, d) if d > 1 else var * a + c
            if plain.min() < lo:
                lin = I.imax(lin, lo)
            if plain.max() > hi:
                lin = I.imin(lin, hi)
            return lin
    return None


def lower_resize(ctx: LowerCtx, node: OnnxNode, x: str, out_shape: tuple[int, ...], mode: str, coord: str,
                 rounding: str, cubic_a: float, exclude_outside: bool, scales: list[float], antialias: bool = False,
                 roi: list[float] | None = None, extrapolation: float = 0.0) -> None:
    """The layout stages of a Resize (one per axis with several taps, else one); `roi` (tf_crop_and_resize): per
    axis (start, end) of the crop, positions whose coordinate falls outside the input reading `extrapolation`."""
    in_shape = ctx.shape(x)
    ivars = I.out_vars(len(out_shape))
    out = node.outputs[0]
    axes: list[list[tuple[I.Lin, E.Expr | None]]] = []  # per axis: its taps (index, weight or None for 1)
    inside: list[E.Expr] = []  # per cropped axis with positions outside the input: 1 inside, 0 outside
    for k, (n_in, n_out) in enumerate(zip(in_shape, out_shape)):
        cropped = roi is not None and (roi[k], roi[k + len(in_shape)]) != (0.0, 1.0)
        if not cropped and n_in == n_out and (scales[k] == 1 or mode == "nearest" and coord in ("asymmetric",
                                                                                                "align_corners")):
            axes.append([(ivars[k], None)])
            continue
        if cropped:
            start, end = roi[k], roi[k + len(in_shape)]
            span = (end - start) * (n_in - 1)
            pos = np.arange(n_out, dtype=np.float64)
            coords = (start * (n_in - 1) + pos * span / (n_out - 1) if n_out > 1
                      else np.full(n_out, 0.5 * (start + end) * (n_in - 1)))
        else:
            coords = source_coords(coord, n_in, n_out, scales[k])
        if mode == "nearest":
            idx, wts = nearest_taps(coords, n_in, rounding)
        else:
            shrink = min(scales[k], 1.0) if antialias else 1.0
            idx, wts = filter_taps(coords, n_in, cubic_a if mode == "cubic" else None, exclude_outside, shrink)
        if cropped:
            valid = ((coords >= 0) & (coords <= n_in - 1)).astype(np.float64)
            wts = wts * valid[:, None]
            if not valid.all():
                table = ctx.fresh(f"{out}::inside{k}")
                ctx.set_const(table, valid.astype(np.float32))
                inside.append(ctx.load(table, (ivars[k],)))
        taps: dict = {}
        for j in range(idx.shape[1]):
            if not wts[:, j].any():
                continue
            index = affine_index(idx[:, j], n_in, ivars[k])
            if index is None:
                table = ctx.fresh(f"{out}::index{k}_{j}")
                ctx.set_const(table, idx[:, j])
                index = I.as_lin(I.Indirect(table, (ivars[k],), n_in))
            # Taps reading the same position sum their weights (edge clamps make such pairs).
            taps.setdefault(str(index), [index, np.zeros(n_out)])[1] += wts[:, j]
        axis = []
        for index, w in taps.values():
            if not w.any():
                continue
            if np.all(w == 1):
                weight = None
            elif np.all(w == w[0]):
                weight = E.imm(float(w[0]), DType.F32)
            else:
                table = ctx.fresh(f"{out}::weight{k}")
                ctx.set_const(table, w.astype(np.float32))
                weight = ctx.load(table, (ivars[k],))
            axis.append((index, weight))
        axes.append(axis)
    dtype = ctx.dtype(x)
    if not dtype.is_float and any(w is not None for axis in axes for _, w in axis):
        raise ctx.unsupported(f"mode={mode} on {dtype.value} data")
    filtered = [k for k, taps in enumerate(axes) if len(taps) > 1]
    if SEPARABLE and len(filtered) > 1 and not (inside and extrapolation != 0.0):
        # Separable, as the ONNX reference computes it: one stage per axis with several taps, innermost first
        # (its gathered reads on the smaller tensor; the next axis reads whole rows), the one-tap axes with
        # the first. 2 + 2 taps instead of 4 products of 3 factors, and the outer axis's reads contiguous.
        src, shape = x, list(in_shape)
        for j, k in enumerate(reversed(filtered)):
            now = [k] + ([a for a in range(len(axes)) if a not in filtered] if j == 0 else [])
            for a in now:
                shape[a] = out_shape[a]
            parts = [axes[a] if a in now else [(ivars[a], None)] for a in range(len(axes))]
            name = out if j == len(filtered) - 1 else ctx.tmp(out, f"resize{k}")
            ctx.emit(name, tuple(shape), dtype, _sum_of_taps(ctx, src, parts), kind=StageKind.LAYOUT, op="resize")
            src = name
        return
    body = _sum_of_taps(ctx, x, axes)
    if inside and extrapolation != 0.0:  # outside the input on some axis: the extrapolation value
        every = inside[0]
        for v in inside[1:]:
            every = E.mul(every, v)
        body = E.add(body, E.mul(E.sub(E.imm(1.0, dtype), every), E.imm(extrapolation, dtype)))
    ctx.emit(out, out_shape, dtype, body, kind=StageKind.LAYOUT, op="resize")


def _sum_of_taps(ctx: LowerCtx, x: str, axes: list) -> E.Expr:
    """Sum over every combination of the axes' taps of the input read there times the taps' weights."""
    body = None
    for combo in itertools.product(*axes):
        term = ctx.load(x, tuple(index for index, _ in combo))
        for _, w in combo:
            if w is not None:
                term = E.mul(term, w)
        body = term if body is None else E.add(body, term)
    return body


@register("Resize")
def convert_resize(ctx: LowerCtx, node: OnnxNode) -> None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    mode = ctx.attr(node, "mode", "nearest")
    coord = ctx.attr(node, "coordinate_transformation_mode", "half_pixel" if ctx.opset >= 11 else "asymmetric")
    rounding = ctx.attr(node, "nearest_mode", "round_prefer_floor")
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.unsupported(f"mode={mode}")
    if coord not in COORDINATE_MODES + ("tf_crop_and_resize",):
        raise ctx.unsupported(f"coordinate_transformation_mode={coord}")
    if rounding not in NEAREST_MODES:
        raise ctx.unsupported(f"nearest_mode={rounding}")
    policy = ctx.attr(node, "keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise ctx.unsupported(f"keep_aspect_ratio_policy={policy}")
    axes = [a % rank for a in ctx.attr(node, "axes", list(range(rank)))]
    if ctx.opset < 11:
        given_scales, sizes = ctx.require_const(node.inputs[1], "scales").astype(np.float64).tolist(), None
    else:
        k_scales, k_sizes = 2, 3
        given_scales = (ctx.require_const(node.inputs[k_scales], "scales").astype(np.float64).tolist()
                        if ctx.has(node, k_scales) and ctx.shape(node.inputs[k_scales]) != (0,) else None)
        sizes = ([int(v) for v in ctx.require_const(node.inputs[k_sizes], "sizes").ravel()]
                 if ctx.has(node, k_sizes) and ctx.shape(node.inputs[k_sizes]) != (0,) else None)
        if (given_scales is None) == (sizes is None):
            raise ctx.unsupported("Resize without exactly one of scales and sizes")
    scales = [1.0] * rank
    out_shape = list(shape)
    keep = None
    if sizes is not None and policy != "stretch":  # one scale for every axis, the output rounded from it
        keep = (min if policy == "not_larger" else max)(sz / shape[a] for sz, a in zip(sizes, axes))
    for j, a in enumerate(axes):
        if keep is not None:
            scales[a] = keep
            out_shape[a] = int(math.floor(keep * shape[a] + 0.5))
        elif sizes is not None:
            out_shape[a] = sizes[j]
            scales[a] = sizes[j] / shape[a]
        else:
            scales[a] = given_scales[j]
            out_shape[a] = int(math.floor(shape[a] * given_scales[j]))
    if min(out_shape) < 1 or min(scales) <= 0:
        raise ctx.unsupported(f"scales {scales} giving an output of {out_shape}")
    roi = None
    if coord == "tf_crop_and_resize":
        given = ctx.require_const(node.inputs[1], "roi").astype(np.float64).ravel().tolist() \
            if ctx.has(node, 1) and ctx.shape(node.inputs[1]) != (0,) else None
        if given is None or len(given) != 2 * len(axes):
            raise ctx.unsupported("tf_crop_and_resize without a roi of a start and an end per axis")
        roi = [0.0] * rank + [1.0] * rank
        for j, a in enumerate(axes):
            roi[a], roi[a + rank] = given[j], given[j + len(axes)]
    lower_resize(ctx, node, x, tuple(out_shape), mode, coord, rounding, float(ctx.attr(node, "cubic_coeff_a", -0.75)),
                 bool(int(ctx.attr(node, "exclude_outside", 0))), scales, bool(int(ctx.attr(node, "antialias", 0))),
                 roi, float(ctx.attr(node, "extrapolation_value", 0.0)))


@register("Upsample")
def convert_upsample(ctx: LowerCtx, node: OnnxNode) -> None:
    """Upsample (opsets 7-9, deprecated): Resize with asymmetric coordinates, nearest rounding down."""
    x = node.inputs[0]
    shape = ctx.shape(x)
    mode = ctx.attr(node, "mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise ctx.unsupported(f"mode={mode}")
    scales = (list(ctx.attr(node, "scales")) if ctx.opset < 9 and ctx.attr(node, "scales") is not None
              else ctx.require_const(node.inputs[1], "scales").astype(np.float64).tolist())
    out_shape = tuple(int(math.floor(n * s)) for n, s in zip(shape, scales))
    lower_resize(ctx, node, x, out_shape, "nearest" if mode == "nearest" else "linear", "asymmetric", "floor",
                 -0.75, False, [float(s) for s in scales])
