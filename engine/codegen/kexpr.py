"""Scalar-expression nodes the kernel IR adds to engine/ir/expr.py, and rewrites over bodies.

`Guard` is an inlined padded read: the producer's value where the index is inside its tensor, the pad
elsewhere; printers evaluate the value only inside the guard (it may read out of bounds otherwise).
`Inlined` marks where a REGISTER producer's value was inlined (provenance for the work count,
engine/codegen/count.py); printers see through it (`strip`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine
from engine.ir.hashing import hash_once


@dataclass(frozen=True)
class InBounds:
    index: tuple[I.Lin, ...]
    shape: tuple[int, ...]
    dtype: DType = DType.BOOL


@dataclass(frozen=True)
class Guard:
    cond: InBounds
    x: object  # Expr
    pad: E.Imm

    @property
    def dtype(self) -> DType:
        return self.pad.dtype


@dataclass(frozen=True)
class Reduce:
    """A reduction inlined into its single one-to-one consumer (a REGISTER edge out of a reduce or
    contraction, e.g. a GEMM accumulator feeding its epilogue): the consuming thread runs the loop."""

    body: object  # Expr over `vars` and the consumer's variables
    vars: tuple[str, ...]  # loop variables, renamed apart from the consumer's r0..
    extents: tuple[int, ...]
    combine: Combine
    dtype: DType


@dataclass(frozen=True)
class Inlined:
    """Stage `stage`'s value, inlined at a use by a REGISTER edge: the same value as `x`, with its origin
    kept so the work count can say how often each producer is evaluated."""

    stage: str
    x: object  # Expr (or Reduce / Guard)

    @property
    def dtype(self) -> DType:
        return self.x.dtype


def kchildren(e) -> tuple:
    """Children of a kernel-IR node, Guard values (and conditions), inlined reductions and values included."""
    if isinstance(e, Guard):
        return (e.cond, e.x)
    if isinstance(e, (Reduce, Inlined)):
        return (e.body if isinstance(e, Reduce) else e.x,)
    return E.children(e)


def strip(e, memo: dict | None = None):
    """`e` without Inlined markers (what printers render); shared subtrees stay shared."""
    memo = {} if memo is None else memo
    key = id(e)
    hit = memo.get(key)
    if hit is not None and hit[0] is e:
        return hit[1]
    if isinstance(e, Inlined):
        out = strip(e.x, memo)
    elif isinstance(e, Guard):
        out = Guard(e.cond, strip(e.x, memo), e.pad)
    elif isinstance(e, Reduce):
        out = Reduce(strip(e.body, memo), e.vars, e.extents, e.combine, e.dtype)
    elif isinstance(e, E.Unary):
        out = E.Unary(e.op, strip(e.x, memo), e.dtype)
    elif isinstance(e, E.Cast):
        out = E.Cast(strip(e.x, memo), e.dtype)
    elif isinstance(e, E.Binary):
        out = E.Binary(e.op, strip(e.a, memo), strip(e.b, memo), e.dtype)
    elif isinstance(e, E.Select):
        out = E.Select(strip(e.cond, memo), strip(e.a, memo), strip(e.b, memo), e.dtype)
    else:
        out = e
    memo[key] = (e, out)
    return out


def kmap(e, fn: Callable, memo: dict | None = None):
    """Bottom-up rebuild like `expr.map_expr`, also descending into Guard values and inlined reductions.
    Equal subtrees are rebuilt once (`fn` must give equal results for equal nodes within one call):
    inlined bodies are DAGs, and a tree walk of them is exponential in the chain length (x * sigmoid(x)
    read through a chain of such stages)."""
    memo = {} if memo is None else memo
    hit = memo.get(e)
    if hit is not None:
        return hit
    key = e
    if isinstance(e, Inlined):
        out = fn(Inlined(e.stage, kmap(e.x, fn, memo)))
    elif isinstance(e, Guard):
        out = fn(Guard(fn(e.cond), kmap(e.x, fn, memo), e.pad))
    elif isinstance(e, Reduce):
        out = fn(Reduce(kmap(e.body, fn, memo), e.vars, e.extents, e.combine, e.dtype))
    else:
        if isinstance(e, E.Unary):
            e = E.Unary(e.op, kmap(e.x, fn, memo), e.dtype)
        elif isinstance(e, E.Cast):
            e = E.Cast(kmap(e.x, fn, memo), e.dtype)
        elif isinstance(e, E.Binary):
            e = E.Binary(e.op, kmap(e.a, fn, memo), kmap(e.b, fn, memo), e.dtype)
        elif isinstance(e, E.Select):
            e = E.Select(kmap(e.cond, fn, memo), kmap(e.a, fn, memo), kmap(e.b, fn, memo), e.dtype)
        out = fn(e)
    memo[key] = out
    return out


def map_indices(e, fn: Callable[[I.Lin], I.Lin]):
    """Apply `fn` to every index expression of loads, index values and guards."""

    def visit(n):
        if isinstance(n, E.Load):
            return E.Load(n.tensor, tuple(fn(ix) for ix in n.index), n.dtype, n.pad)
        if isinstance(n, E.IndexVal):
            return E.IndexVal(fn(n.expr), n.dtype)
        if isinstance(n, InBounds):
            return InBounds(tuple(fn(ix) for ix in n.index), n.shape)
        return n

    return kmap(e, visit)


def substitute_body(body, mapping: dict[str, I.Lin]):
    """The body with its output variables replaced (a producer read at the consumer's index)."""
    return map_indices(body, lambda ix: I.substitute(ix, mapping))


def kwalk(e):
    """Pre-order walk including Guard values and conditions; each distinct node object once (bodies
    are DAGs: a tree walk would be exponential in a chain of stages read twice each)."""
    stack, seen = [e], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        yield n
        stack.extend(reversed(kchildren(n)))


def free_vars(e, memo: dict | None = None) -> frozenset[str]:
    """Loop variables an expression depends on (an inlined reduction binds its own). Memoised on the
    node across calls (a pure function of its structure: the session's "kexpr.free_vars" table) unless
    the caller passes its own memo (keyed on node identity)."""
    if memo is None:
        from engine.memo import memo as table

        return _free_vars(e, table("kexpr.free_vars", 200000).raw(), True)
    return _free_vars(e, memo, False)


def _free_vars(e, memo: dict, by_value: bool) -> frozenset[str]:
    key = e if by_value else id(e)
    if key in memo:
        return memo[key]
    if isinstance(e, (E.Load, InBounds)):
        out = frozenset().union(*(ix.vars() for ix in e.index)) if e.index else frozenset()
    elif isinstance(e, E.IndexVal):
        out = e.expr.vars()
    elif isinstance(e, Guard):
        out = _free_vars(e.cond, memo, by_value) | _free_vars(e.x, memo, by_value)
    elif isinstance(e, Reduce):
        out = _free_vars(e.body, memo, by_value) - set(e.vars)
    elif isinstance(e, Inlined):
        out = _free_vars(e.x, memo, by_value)
    else:
        kids = E.children(e)
        out = frozenset().union(*(_free_vars(c, memo, by_value) for c in kids)) if kids else frozenset()
    memo[key] = out
    return out


def loaded(e) -> frozenset[str]:
    """Names of the tensors (kernel buffers) the loads in an expression read, under guards and in inlined
    reductions too. Memoised on the node across calls (the session's "kexpr.loaded" table)."""
    from engine.memo import memo as table

    return _loaded(e, table("kexpr.loaded", 200000).raw())


def _loaded(e, memo: dict) -> frozenset[str]:
    if e in memo:
        return memo[e]
    kids = kchildren(e)
    out = frozenset().union(*(_loaded(c, memo) for c in kids)) if kids else frozenset()
    if isinstance(e, E.Load):
        out |= {e.tensor}
    memo[e] = out
    return out


def kformat(e) -> str:
    """Text of a kernel-IR body (expr.format_expr plus guards and inlined reductions)."""
    if isinstance(e, Inlined):
        return kformat(e.x)
    if isinstance(e, Guard):
        return f"guard({kformat(e.x)}, pad={e.pad.value})"
    if isinstance(e, Reduce):
        return f"{e.combine.value}[{', '.join(e.vars)}]({kformat(e.body)})"
    if isinstance(e, InBounds):
        return "inbounds"
    if isinstance(e, E.Unary):
        return f"{e.op}({kformat(e.x)})"
    if isinstance(e, E.Cast):
        return f"{e.dtype.short}({kformat(e.x)})"
    if isinstance(e, E.Binary):
        return f"{e.op}({kformat(e.a)}, {kformat(e.b)})"
    if isinstance(e, E.Select):
        return f"({kformat(e.cond)} ? {kformat(e.a)} : {kformat(e.b)})"
    return E.format_expr(e)


hash_once(InBounds, Guard, Reduce, Inlined)
