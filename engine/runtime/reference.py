"""Reference executor: evaluates a PrimGraph stage by stage with NumPy (the semantic oracle beside
onnxruntime). It runs the primitive stages, not ONNX ops, so it proves the lowering.

Each subexpression is evaluated only over the loop variables it depends on (named axes) and
broadcast when combined; a sum over a product of loads becomes one `einsum`, so a matmul never
materializes its i×j×k iteration space. Large iteration spaces are chunked along an output axis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine, PrimGraph, Stage

CHUNK_ELEMENTS = 1 << 24  # iteration points evaluated at once before chunking an output axis

Ranges = dict[str, tuple[int, int]]  # var -> [start, stop)


class Val:
    """An array over named axes (loop variables), axes in canonical order."""

    __slots__ = ("arr", "axes")

    def __init__(self, arr: np.ndarray, axes: tuple[str, ...]):
        self.arr = arr
        self.axes = axes


def run_reference(graph: PrimGraph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run every stage; returns the graph outputs keyed by their ONNX output names."""
    env: dict[str, np.ndarray] = dict(graph.weights)
    for spec in graph.inputs:
        env[spec.name] = np.asarray(inputs[spec.name], dtype=spec.dtype.np)
    for stage in graph.stages:
        env[stage.name] = eval_stage(stage, env)
    return {name: env[t] for name, t in zip(graph.output_names, graph.outputs)}


def eval_stage(stage: Stage, env: Mapping[str, np.ndarray], ranges: Ranges | None = None) -> np.ndarray:
    """Evaluate one stage over the output sub-box `ranges` (default: all of it)."""
    out_vars = [f"i{k}" for k in range(len(stage.shape))]
    red_vars = [f"r{k}" for k in range(len(stage.reduce))]
    full: Ranges = {v: (0, n) for v, n in zip(out_vars, stage.shape)}
    full.update({v: (0, n) for v, n in zip(red_vars, stage.reduce)})
    if ranges:
        full.update(ranges)
    order = {v: k for k, v in enumerate(out_vars + red_vars)}

    # Chunk along the largest output axis when the iteration space is large.
    points = _points(stage, full)
    if points > CHUNK_ELEMENTS and out_vars:
        axis = max(out_vars, key=lambda v: full[v][1] - full[v][0])
        lo, hi = full[axis]
        if hi - lo > 1:
            step = max(1, int((hi - lo) * CHUNK_ELEMENTS // points))
            parts = []
            for s in range(lo, hi, step):
                sub = dict(full)
                sub[axis] = (s, min(hi, s + step))
                parts.append(_eval_box(stage, env, sub, out_vars, red_vars, order))
            return np.concatenate(parts, axis=out_vars.index(axis))
    return _eval_box(stage, env, full, out_vars, red_vars, order)


def _points(stage: Stage, full: Ranges) -> int:
    vs = set()
    for ld in E.walk(stage.body):
        if isinstance(ld, E.Load):
            for ix in ld.index:
                vs |= ix.vars()
    if _product_factors(stage) is not None:
        return 0  # einsum path: factors are small
    return int(np.prod([full[v][1] - full[v][0] for v in vs], dtype=np.float64)) if vs else 1


def _eval_box(stage, env, full: Ranges, out_vars, red_vars, order) -> np.ndarray:
    ctx = _Ctx(env, full, order)
    out_shape = tuple(full[v][1] - full[v][0] for v in out_vars)
    with np.errstate(all="ignore"):
        if stage.combine is None:
            val = ctx.eval(stage.body)
            arr = _broadcast_to(val, out_vars, full)
            return arr.astype(stage.dtype.np, copy=False).reshape(out_shape)
        factors = _product_factors(stage)
        if factors is not None:
            return _einsum(ctx, factors, stage, out_vars, full).reshape(out_shape)
        val = ctx.eval(stage.body)
        arr = _broadcast_to(val, out_vars + red_vars, full)
        red_axes = tuple(range(len(out_vars), len(out_vars) + len(red_vars)))
        arr = _reduce(arr, red_axes, stage.combine, stage.dtype)
        return arr.astype(stage.dtype.np, copy=False).reshape(out_shape)


def _product_factors(stage: Stage) -> list[E.Expr] | None:
    """Factors of a sum-of-products body (matmul, conv), or None when the body is not one."""
    if stage.combine != Combine.SUM or not stage.dtype.is_float:
        return None
    factors: list[E.Expr] = []
    stack = [stage.body]
    while stack:
        node = stack.pop()
        if isinstance(node, E.Binary) and node.op == "mul":
            stack.extend((node.a, node.b))
        else:
            factors.append(node)
    return factors if len(factors) >= 2 else None


def _einsum(ctx: _Ctx, factors, stage: Stage, out_vars, full: Ranges) -> np.ndarray:
    letters: dict[str, str] = {}
    operands, subs = [], []
    acc = np.float32 if stage.dtype in (DType.F32, DType.F16) else np.float64
    for f in factors:
        v = ctx.eval(f)
        operands.append(v.arr.astype(acc, copy=False))
        subs.append("".join(letters.setdefault(a, chr(97 + len(letters))) for a in v.axes))
    present = [v for v in out_vars if v in letters]
    spec = ",".join(subs) + "->" + "".join(letters[v] for v in present)
    res = np.einsum(spec, *operands, optimize=True)
    # Reduce axes the body never depends on still count: sum of a constant over r is r * value.
    for a in full:
        if a.startswith("r") and a not in letters:
            res = res * (full[a][1] - full[a][0])
    return _broadcast_to(Val(np.asarray(res), tuple(present)), out_vars, full).astype(stage.dtype.np, copy=False)


def _reduce(arr: np.ndarray, axes: tuple[int, ...], combine: Combine, dtype: DType) -> np.ndarray:
    if combine == Combine.SUM:
        return np.sum(arr, axis=axes, dtype=np.float32 if arr.dtype == np.float16 else None)
    if combine == Combine.PROD:
        return np.prod(arr, axis=axes)
    if combine in (Combine.MAX, Combine.MIN):
        # ONNX: an empty reduction gives -inf/+inf (or the dtype's lowest/highest value).
        floating = dtype.is_float
        big = np.inf if floating else (np.iinfo(arr.dtype).max if arr.dtype.kind in "iu" else True)
        if combine == Combine.MAX:
            init = -big if floating else (np.iinfo(arr.dtype).min if arr.dtype.kind in "iu" else False)
            return np.max(arr, axis=axes, initial=init)
        return np.min(arr, axis=axes, initial=big)
    if combine in (Combine.ARGMAX, Combine.ARGMIN):
        (ax,) = axes
        f = np.argmax if combine == Combine.ARGMAX else np.argmin
        return f(arr, axis=ax).astype(np.int64)
    raise ValueError(combine)


def _broadcast_to(val: Val, axes: list[str], full: Ranges) -> np.ndarray:
    """Expand `val` (over a subset of `axes`) to the full box over `axes`, in that order."""
    arr = val.arr
    src = list(val.axes)
    missing = [a for a in src if a not in axes]
    if missing:
        raise ValueError(f"value depends on {missing} outside {axes}")
    perm = sorted(range(len(src)), key=lambda k: axes.index(src[k]))
    arr = np.transpose(arr, perm) if perm != list(range(len(src))) else arr
    src = [src[k] for k in perm]
    shape = []
    for a in axes:
        shape.append(full[a][1] - full[a][0] if a in src else 1)
    arr = arr.reshape(shape)
    return np.broadcast_to(arr, tuple(full[a][1] - full[a][0] for a in axes))


class _Ctx:
    def __init__(self, env: Mapping[str, np.ndarray], full: Ranges, order: dict[str, int]):
        self.env = env
        self.full = full
        self.order = order
        self.memo: dict[int, Val] = {}

    # ---- index expressions ----------------------------------------------------------------
    def idx(self, e: I.Lin) -> Val:
        acc = Val(np.asarray(e.const, dtype=np.int64), ())
        for atom, k in e.terms:
            a = self.atom(atom)
            acc = self.combine2(acc, Val(a.arr * k, a.axes), np.add)
        return acc

    def atom(self, atom) -> Val:
        if isinstance(atom, I.Var):
            lo, hi = self.full[atom.name]
            return Val(np.arange(lo, hi, dtype=np.int64), (atom.name,))
        if isinstance(atom, I.FloorDiv):
            v = self.idx(atom.x)
            return Val(np.floor_divide(v.arr, atom.k), v.axes)
        if isinstance(atom, I.Mod):
            v = self.idx(atom.x)
            return Val(np.mod(v.arr, atom.k), v.axes)
        if isinstance(atom, I.Abs):
            v = self.idx(atom.x)
            return Val(np.abs(v.arr), v.axes)
        if isinstance(atom, (I.Min, I.Max)):
            f = np.minimum if isinstance(atom, I.Min) else np.maximum
            return self.combine2(self.idx(atom.a), self.idx(atom.b), f)
        if isinstance(atom, I.Indirect):
            v = self.gather(atom.tensor, atom.index, None)
            arr = v.arr.astype(np.int64)
            arr = np.where(arr < 0, arr + atom.size, arr)
            return Val(arr, v.axes)
        raise TypeError(atom)

    # ---- values -------------------------------------------------------------------------
    def combine2(self, a: Val, b: Val, fn) -> Val:
        axes = tuple(sorted(set(a.axes) | set(b.axes), key=self.order.__getitem__))
        return Val(fn(self._expand(a, axes), self._expand(b, axes)), axes)

    def _expand(self, v: Val, axes: tuple[str, ...]) -> np.ndarray:
        if v.axes == axes:
            return v.arr
        shape = [self.full[a][1] - self.full[a][0] if a in v.axes else 1 for a in axes]
        # v.axes are in canonical order, a subsequence of axes, so a reshape suffices.
        return v.arr.reshape(shape)

    def gather(self, tensor: str, index: tuple[I.Lin, ...], pad) -> Val:
        data = self.env[tensor]
        fast = self._slice_load(data, index) if pad is None else None
        if fast is not None:
            return fast
        idx = [self.idx(e) for e in index]
        axes = tuple(sorted(set().union(*[set(v.axes) for v in idx]) if idx else set(), key=self.order.__getitem__))
        arrays = [self._expand(v, axes) for v in idx]
        if pad is None:
            out = data[tuple(arrays)] if arrays else data[()]
            return Val(np.asarray(out), axes)
        mask = np.ones((), dtype=bool)
        clipped = []
        for a, n in zip(arrays, data.shape):
            mask = mask & (a >= 0) & (a < n)
            clipped.append(np.clip(a, 0, max(n - 1, 0)))
        vals = data[tuple(clipped)] if clipped else data[()]
        return Val(np.where(mask, vals, np.asarray(pad, dtype=data.dtype)), axes)

    def _slice_load(self, data: np.ndarray, index: tuple[I.Lin, ...]) -> Val | None:
        """Basic slicing + transpose when every index is `var + c` (each var once) or a constant."""
        sl, axes_seen = [], []
        for e, n in zip(index, data.shape):
            if e.is_const:
                if not 0 <= e.const < n:
                    return None
                sl.append(e.const)
                continue
            if len(e.terms) != 1 or e.terms[0][1] != 1 or not isinstance(e.terms[0][0], I.Var):
                return None
            name = e.terms[0][0].name
            if name in axes_seen:
                return None
            lo, hi = self.full[name]
            if lo + e.const < 0 or hi + e.const > n:
                return None
            sl.append(slice(lo + e.const, hi + e.const))
            axes_seen.append(name)
        arr = data[tuple(sl)]
        order = sorted(range(len(axes_seen)), key=lambda k: self.order[axes_seen[k]])
        if order != list(range(len(axes_seen))):
            arr = np.transpose(arr, order)
        return Val(arr, tuple(axes_seen[k] for k in order))

    def eval(self, e: E.Expr) -> Val:
        key = id(e)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        out = self._eval(e)
        self.memo[key] = out
        return out

    def _eval(self, e: E.Expr) -> Val:
        if isinstance(e, E.Load):
            v = self.gather(e.tensor, e.index, e.pad)
            return Val(v.arr.astype(e.dtype.np, copy=False), v.axes)
        if isinstance(e, E.Imm):
            return Val(np.asarray(e.value, dtype=e.dtype.np), ())
        if isinstance(e, E.IndexVal):
            v = self.idx(e.expr)
            return Val(v.arr.astype(e.dtype.np), v.axes)
        if isinstance(e, E.Cast):
            v = self.eval(e.x)
            return Val(_cast(v.arr, e.dtype), v.axes)
        if isinstance(e, E.Unary):
            v = self.eval(e.x)
            return Val(np.asarray(_UNARY[e.op](v.arr)).astype(e.dtype.np, copy=False), v.axes)
        if isinstance(e, E.Binary):
            a, b = self.eval(e.a), self.eval(e.b)
            out = self.combine2(a, b, _BINARY[e.op])
            return Val(np.asarray(out.arr).astype(e.dtype.np, copy=False), out.axes)
        if isinstance(e, E.Select):
            vals = [self.eval(e.cond), self.eval(e.a), self.eval(e.b)]
            axes = tuple(sorted(set().union(*[set(v.axes) for v in vals]), key=self.order.__getitem__))
            c, a, b = (self._expand(v, axes) for v in vals)
            return Val(np.where(c, a, b).astype(e.dtype.np, copy=False), axes)
        raise TypeError(e)


def _cast(arr: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype == DType.BOOL:
        return arr != 0
    if dtype.is_int and arr.dtype.kind == "f":
        # C semantics (truncate toward zero); NaN/inf are undefined in ONNX and map to 0 here.
        arr = np.where(np.isfinite(arr), np.trunc(arr), 0)
    return arr.astype(dtype.np)


_erf = np.frompyfunc(math.erf, 1, 1)


def _erf_np(x: np.ndarray) -> np.ndarray:
    return _erf(x.astype(np.float64)).astype(np.float64).astype(x.dtype)


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        safe = np.where(b == 0, 1, b)
        q = np.floor_divide(a, safe)
        fix = (np.mod(a, safe) != 0) & ((a < 0) != (safe < 0))
        return q + fix
    return a / b


def _pow(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return np.power(a, np.maximum(b, 0))
    if a.dtype.kind in "iu":
        return np.power(a.astype(np.float64), b).astype(a.dtype)
    return np.power(a, b.astype(a.dtype) if b.dtype.kind != "f" else b)


def _sigmoid(x):
    return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype)


_UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "recip": lambda x: 1.0 / x, "tanh": np.tanh, "erf": _erf_np,
    "sigmoid": _sigmoid, "ceil": np.ceil, "floor": np.floor, "round": np.rint, "not": np.logical_not,
    "sin": np.sin, "cos": np.cos, "isnan": np.isnan, "sign": np.sign, "tan": np.tan, "asin": np.arcsin,
    "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh,
    "atanh": np.arctanh,
}
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _trunc_div, "pow": _pow,
    "min": np.minimum, "max": np.maximum, "mod": np.mod, "fmod": np.fmod,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor,
}
