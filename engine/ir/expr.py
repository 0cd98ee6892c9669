"""Scalar body expressions of a stage: math over `Load(tensor, index)` values.

Every node carries its dtype, so a body is self-describing; nodes are frozen dataclasses with
structural equality and hashing (caches and CSE key on them).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass

from engine.ir.dtypes import DType
from engine.ir.hashing import hash_once
from engine.ir.index import Lin, as_lin

# Unary ops every target prints as the C math library's float function of the same name (tanf, asinf, ...:
# CUDA and OpenCL have them too); the C target's are scalar calls, one vector lane each (CPrinter.scalar_calls).
LIBM_CALLS = ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")
UNARY_OPS = frozenset(
    "neg abs exp log sqrt rsqrt recip tanh erf sigmoid ceil floor round not sin cos isnan sign".split() + list(LIBM_CALLS)
)
BINARY_OPS = frozenset("add sub mul div pow min max mod fmod eq ne lt le gt ge and or xor".split())
COMPARE_OPS = frozenset("eq ne lt le gt ge".split())
COMPARE = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
           "ge": operator.ge}  # a comparison op on two Python values
_MIRRORED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}  # a op b == b op' a
LOGIC_OPS = frozenset("and or xor".split())
# Rough cost in flops of one evaluation, for the cost model (transcendentals cost more).
OP_FLOPS = {
    "exp": 4, "log": 4, "sqrt": 2, "rsqrt": 2, "recip": 1, "tanh": 6, "erf": 8, "sigmoid": 5, "pow": 8,
    "sin": 6, "cos": 6, "div": 1,
    "tan": 8, "asin": 8, "acos": 8, "atan": 8, "sinh": 8, "cosh": 8, "asinh": 8, "acosh": 8, "atanh": 8,
}


@dataclass(frozen=True)
class Load:
    """tensor[index]; with `pad` set, an index outside the tensor reads `pad` (Pad, conv padding,
    concat) instead of being an error."""

    tensor: str
    index: tuple[Lin, ...]
    dtype: DType
    pad: float | int | bool | None = None


@dataclass(frozen=True)
class Imm:
    value: float | int | bool
    dtype: DType


@dataclass(frozen=True)
class IndexVal:
    """The integer value of an index expression (iota, ArgMax positions, concat/pad masks)."""

    expr: Lin
    dtype: DType = DType.I64


@dataclass(frozen=True)
class Unary:
    op: str
    x: Expr
    dtype: DType


@dataclass(frozen=True)
class Binary:
    op: str
    a: Expr
    b: Expr
    dtype: DType


@dataclass(frozen=True)
class Select:
    cond: Expr
    a: Expr
    b: Expr
    dtype: DType


@dataclass(frozen=True)
class Cast:
    x: Expr
    dtype: DType


Expr = Load | Imm | IndexVal | Unary | Binary | Select | Cast


# ---- builders (keep converters short) ----------------------------------------------------


def imm(value: float | int | bool, dtype: DType = DType.F32) -> Imm:
    if dtype.is_float:
        value = float(value)
    elif dtype == DType.BOOL:
        value = bool(value)
    else:
        value = int(value)
    return Imm(value, dtype)


def unary(op: str, x: Expr) -> Expr:
    assert op in UNARY_OPS, op
    dtype = DType.BOOL if op in ("not", "isnan") else x.dtype
    return Unary(op, x, dtype)


def binary(op: str, a: Expr, b: Expr) -> Expr:
    assert op in BINARY_OPS, op
    dtype = DType.BOOL if op in COMPARE_OPS or op in LOGIC_OPS else a.dtype
    return Binary(op, a, b, dtype)


def select(cond: Expr, a: Expr, b: Expr) -> Expr:
    return Select(cond, a, b, a.dtype)


def cast(x: Expr, dtype: DType) -> Expr:
    return x if x.dtype == dtype else Cast(x, dtype)


def index_val(e: Lin | int) -> IndexVal:
    return IndexVal(as_lin(e))


def add(a: Expr, b: Expr) -> Expr:
    return binary("add", a, b)


def sub(a: Expr, b: Expr) -> Expr:
    return binary("sub", a, b)


def mul(a: Expr, b: Expr) -> Expr:
    return binary("mul", a, b)


def div(a: Expr, b: Expr) -> Expr:
    return binary("div", a, b)


# ---- traversal ----------------------------------------------------------------------------


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, (Unary, Cast)):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    return ()


def walk(e: Expr) -> Iterator[Expr]:
    """Pre-order walk over the expression tree (shared subtrees visited once per occurrence)."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]


def tensors_read(e: Expr) -> tuple[str, ...]:
    """Tensors the expression reads (loads and gathered indices), in first-use order."""
    names: list[str] = []
    for n in walk(e):
        if isinstance(n, Load):
            names.append(n.tensor)
            for ix in n.index:
                names.extend(ix.indirect_tensors())
        elif isinstance(n, IndexVal):
            names.extend(n.expr.indirect_tensors())
    return tuple(dict.fromkeys(names))


def map_expr(e: Expr, fn) -> Expr:
    """Rebuild bottom-up, applying `fn` to each rebuilt node (fn returns a node)."""
    if isinstance(e, Unary):
        e = Unary(e.op, map_expr(e.x, fn), e.dtype)
    elif isinstance(e, Cast):
        e = Cast(map_expr(e.x, fn), e.dtype)
    elif isinstance(e, Binary):
        e = Binary(e.op, map_expr(e.a, fn), map_expr(e.b, fn), e.dtype)
    elif isinstance(e, Select):
        e = Select(map_expr(e.cond, fn), map_expr(e.a, fn), map_expr(e.b, fn), e.dtype)
    return fn(e)


# pow with these float exponents is printed as multiplies (x*x, x*x*x) or sqrt: its cost as printed.
SMALL_POW_FLOPS = {1.0: 0, 2.0: 1, 3.0: 2, 0.5: 2}


def small_pow(n: Expr) -> bool:
    return (isinstance(n, Binary) and n.op == "pow" and n.a.dtype.is_float and isinstance(n.b, Imm)
            and n.b.value in SMALL_POW_FLOPS)


def op_flops(n: Expr) -> int:
    """Arithmetic operations of one node (not its operands): transcendentals weighted by OP_FLOPS, a pow
    by a small constant as the multiplies it is printed as. The kernel IR's count uses the same weights."""
    if small_pow(n):
        return SMALL_POW_FLOPS[n.b.value]
    if isinstance(n, (Unary, Binary)):
        return OP_FLOPS.get(n.op, 1)
    return 1 if isinstance(n, Select) else 0


def count_flops(e: Expr) -> int:
    """Arithmetic operations per evaluation of the body (`op_flops` per node)."""
    return sum(op_flops(n) for n in walk(e))


def format_expr(e: Expr) -> str:
    if isinstance(e, Load):
        idx = ", ".join(str(i) for i in e.index)
        pad = "" if e.pad is None else f" pad={e.pad}"
        return f"{e.tensor}[{idx}]{pad}"
    if isinstance(e, Imm):
        return repr(e.value) if e.dtype.is_float else str(e.value)
    if isinstance(e, IndexVal):
        return f"idx({e.expr})"
    if isinstance(e, Unary):
        return f"{e.op}({format_expr(e.x)})"
    if isinstance(e, Cast):
        return f"{e.dtype.short}({format_expr(e.x)})"
    if isinstance(e, Binary):
        sym = _INFIX.get(e.op)
        if sym:
            return f"({format_expr(e.a)} {sym} {format_expr(e.b)})"
        return f"{e.op}({format_expr(e.a)}, {format_expr(e.b)})"
    if isinstance(e, Select):
        return f"({format_expr(e.cond)} ? {format_expr(e.a)} : {format_expr(e.b)})"
    raise TypeError(e)


_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "eq": "==", "ne": "!=", "lt": "<", "le": "<=",
          "gt": ">", "ge": ">=", "and": "&&", "or": "||"}


hash_once(Load, Imm, IndexVal, Unary, Binary, Select, Cast)


def index_comparison(cond) -> tuple[Lin, str, int] | None:
    """(index, op, m) where `cond` compares an index value with an integer constant (either side; a
    concatenation's or a pad's mask), as `index op m`; None for any other condition."""
    if not (isinstance(cond, Binary) and cond.op in COMPARE_OPS):
        return None
    a, b, op = cond.a, cond.b, cond.op
    if isinstance(a, Imm) and isinstance(b, IndexVal):
        a, b, op = b, a, _MIRRORED[op]
    if isinstance(a, IndexVal) and isinstance(b, Imm) and isinstance(b.value, int) and not isinstance(b.value, bool):
        return a.expr, op, b.value
    return None
