"""Scalar-expression nodes the kernel IR adds to engine/ir/expr.py, and rewrites over bodies.

`Guard` is an inlined padded read: the producer's value where the index is inside its tensor, the pad
elsewhere; printers evaluate the value only inside the guard (it may read out of bounds otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType


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


def kmap(e, fn: Callable):
    """Bottom-up rebuild like `expr.map_expr`, also descending into Guard values."""
    if isinstance(e, Guard):
        return fn(Guard(fn(e.cond), kmap(e.x, fn), e.pad))
    if isinstance(e, E.Unary):
        e = E.Unary(e.op, kmap(e.x, fn), e.dtype)
    elif isinstance(e, E.Cast):
        e = E.Cast(kmap(e.x, fn), e.dtype)
    elif isinstance(e, E.Binary):
        e = E.Binary(e.op, kmap(e.a, fn), kmap(e.b, fn), e.dtype)
    elif isinstance(e, E.Select):
        e = E.Select(kmap(e.cond, fn), kmap(e.a, fn), kmap(e.b, fn), e.dtype)
    return fn(e)


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
    """Pre-order walk including Guard values and conditions."""
    stack = [e]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, Guard):
            stack.extend((n.x, n.cond))
        else:
            stack.extend(reversed(E.children(n)))
