"""Index expressions: affine in the loop variables plus floor-division, modulo, min/max/abs and
data-dependent (gathered) atoms. Canonical form: every expression is a `Lin` (sum of coefficient ×
atom plus a constant), so structural equality is semantic equality for the affine part.

Loop variables are named `i0, i1, ...` (output axes) and `r0, r1, ...` (reduce axes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.ir.hashing import hash_once

Interval = tuple[int, int]  # inclusive [lo, hi]


@dataclass(frozen=True)
class Var:
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class FloorDiv:
    x: Lin
    k: int

    def __str__(self) -> str:
        return f"({self.x} // {self.k})"


@dataclass(frozen=True)
class Mod:
    x: Lin
    k: int

    def __str__(self) -> str:
        return f"({self.x} % {self.k})"


@dataclass(frozen=True)
class Min:
    a: Lin
    b: Lin

    def __str__(self) -> str:
        return f"min({self.a}, {self.b})"


@dataclass(frozen=True)
class Max:
    a: Lin
    b: Lin

    def __str__(self) -> str:
        return f"max({self.a}, {self.b})"


@dataclass(frozen=True)
class Abs:
    x: Lin

    def __str__(self) -> str:
        return f"abs({self.x})"


@dataclass(frozen=True)
class Indirect:
    """The integer value stored in `tensor` at `index` (Gather's indices), wrapped by `size` when
    negative (ONNX semantics) and assumed to lie in [0, size) afterwards."""

    tensor: str
    index: tuple[Lin, ...]
    size: int

    def __str__(self) -> str:
        return f"{self.tensor}[{', '.join(map(str, self.index))}]"


Atom = Var | FloorDiv | Mod | Min | Max | Abs | Indirect


def _atom_key(atom: Atom) -> tuple[int, str]:
    # Variables first in name order (i0 < i1 < r0), then other atoms by their text.
    if isinstance(atom, Var):
        return (0, f"{atom.name[0]}{int(atom.name[1:]):06d}" if atom.name[1:].isdigit() else atom.name)
    return (1, str(atom))


@dataclass(frozen=True)
class Lin:
    """sum(coeff * atom) + const, terms sorted and merged, zero coefficients dropped."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    # ---- construction -------------------------------------------------------------------
    @staticmethod
    def make(terms: dict | list | tuple, const: int = 0) -> Lin:
        acc: dict[Atom, int] = {}
        items = terms.items() if isinstance(terms, dict) else terms
        for atom, k in items:
            acc[atom] = acc.get(atom, 0) + int(k)
        ordered = tuple(sorted(((a, k) for a, k in acc.items() if k != 0), key=lambda t: _atom_key(t[0])))
        return Lin(ordered, int(const))

    # ---- arithmetic ---------------------------------------------------------------------
    def __add__(self, other: Lin | int) -> Lin:
        other = as_lin(other)
        return Lin.make(list(self.terms) + list(other.terms), self.const + other.const)

    __radd__ = __add__

    def __neg__(self) -> Lin:
        return Lin.make([(a, -k) for a, k in self.terms], -self.const)

    def __sub__(self, other: Lin | int) -> Lin:
        return self + (-as_lin(other))

    def __rsub__(self, other: int) -> Lin:
        return as_lin(other) - self

    def __mul__(self, k: int) -> Lin:
        if not isinstance(k, int):
            raise TypeError("index expressions multiply by integer constants only")
        return Lin.make([(a, c * k) for a, c in self.terms], self.const * k)

    __rmul__ = __mul__

    def __floordiv__(self, k: int) -> Lin:
        return floordiv(self, k)

    def __mod__(self, k: int) -> Lin:
        return mod(self, k)

    # ---- queries ------------------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return not self.terms

    @property
    def is_affine(self) -> bool:
        return all(isinstance(a, Var) for a, _ in self.terms)

    def as_var(self) -> str | None:
        """The variable name when the expression is exactly one variable."""
        if self.const == 0 and len(self.terms) == 1 and self.terms[0][1] == 1 and isinstance(self.terms[0][0], Var):
            return self.terms[0][0].name
        return None

    def vars(self) -> frozenset[str]:
        out: set[str] = set()
        for atom, _ in self.terms:
            out |= atom_vars(atom)
        return frozenset(out)

    def indirect_tensors(self) -> tuple[str, ...]:
        found: list[str] = []
        for atom, _ in self.terms:
            _collect_indirect(atom, found)
        return tuple(dict.fromkeys(found))

    def __str__(self) -> str:
        parts: list[str] = []
        for atom, k in self.terms:
            s = str(atom)
            parts.append(s if k == 1 else f"-{s}" if k == -1 else f"{k}*{s}")
        if self.const or not parts:
            parts.append(str(self.const))
        text = " + ".join(parts)
        return text.replace("+ -", "- ")


def as_lin(x: Lin | Atom | int) -> Lin:
    if isinstance(x, Lin):
        return x
    if isinstance(x, int):
        return Lin((), x)
    return Lin(((x, 1),), 0)


def var(name: str) -> Lin:
    return Lin(((Var(name), 1),), 0)


def out_vars(rank: int) -> tuple[Lin, ...]:
    return tuple(var(f"i{k}") for k in range(rank))


def red_vars(rank: int) -> tuple[Lin, ...]:
    return tuple(var(f"r{k}") for k in range(rank))


def const(value: int) -> Lin:
    return Lin((), int(value))


def atom_vars(atom: Atom) -> frozenset[str]:
    if isinstance(atom, Var):
        return frozenset((atom.name,))
    if isinstance(atom, (FloorDiv, Mod, Abs)):
        return atom.x.vars()
    if isinstance(atom, (Min, Max)):
        return atom.a.vars() | atom.b.vars()
    if isinstance(atom, Indirect):
        out: frozenset[str] = frozenset()
        for e in atom.index:
            out |= e.vars()
        return out
    raise TypeError(atom)


def _collect_indirect(atom: Atom, found: list[str]) -> None:
    if isinstance(atom, Indirect):
        found.append(atom.tensor)
        for e in atom.index:
            for a, _ in e.terms:
                _collect_indirect(a, found)
    elif isinstance(atom, (FloorDiv, Mod, Abs)):
        for a, _ in atom.x.terms:
            _collect_indirect(a, found)
    elif isinstance(atom, (Min, Max)):
        for a, _ in atom.a.terms + atom.b.terms:
            _collect_indirect(a, found)


# ---- interval analysis ------------------------------------------------------------------


def bounds(e: Lin, ranges: dict[str, Interval]) -> tuple[Interval, bool]:
    """Inclusive [lo, hi] of `e` over the box `ranges` (var -> inclusive interval), and whether the
    interval is tight (both ends attained). Affine expressions are always tight: each variable occurs
    once after terms are merged, so the extremes are reached at corners of the box."""
    lo = hi = e.const
    exact = True
    for atom, k in e.terms:
        (alo, ahi), aexact = atom_bounds(atom, ranges)
        exact = exact and aexact
        if k >= 0:
            lo += k * alo
            hi += k * ahi
        else:
            lo += k * ahi
            hi += k * alo
    if len(e.terms) > 1 and not all(isinstance(a, Var) for a, _ in e.terms):
        # Two non-variable atoms may share variables, so their extremes need not coincide.
        shared = _atoms_share_vars([a for a, _ in e.terms])
        exact = exact and not shared
    return (lo, hi), exact


def _atoms_share_vars(atoms: list[Atom]) -> bool:
    seen: set[str] = set()
    for a in atoms:
        vs = atom_vars(a)
        if seen & vs:
            return True
        seen |= vs
    return False


def atom_bounds(atom: Atom, ranges: dict[str, Interval]) -> tuple[Interval, bool]:
    if isinstance(atom, Var):
        return ranges[atom.name], True
    if isinstance(atom, FloorDiv):
        (lo, hi), ex = bounds(atom.x, ranges)
        return (lo // atom.k, hi // atom.k), ex  # monotone: ends attained when the inner ends are
    if isinstance(atom, Mod):
        (lo, hi), ex = bounds(atom.x, ranges)
        if lo // atom.k == hi // atom.k:
            return (lo % atom.k, hi % atom.k), ex  # no wrap: monotone on this range
        # Wraps: the full residue range is a safe hull; tight only if the inner range is dense.
        dense = ex and is_dense(atom.x, ranges)
        if hi - lo + 1 >= atom.k:
            return (0, atom.k - 1), dense
        return (0, atom.k - 1), False
    if isinstance(atom, (Min, Max)):
        (alo, ahi), aex = bounds(atom.a, ranges)
        (blo, bhi), bex = bounds(atom.b, ranges)
        f = min if isinstance(atom, Min) else max
        shared = bool(atom.a.vars() & atom.b.vars())
        return (f(alo, blo), f(ahi, bhi)), aex and bex and not shared
    if isinstance(atom, Abs):
        (lo, hi), ex = bounds(atom.x, ranges)
        if lo >= 0:
            return (lo, hi), ex
        if hi <= 0:
            return (-hi, -lo), ex
        return (0, max(-lo, hi)), ex and is_dense(atom.x, ranges)
    if isinstance(atom, Indirect):
        return (0, atom.size - 1), False  # data dependent: every valid index is possible
    raise TypeError(atom)


def is_dense(e: Lin, ranges: dict[str, Interval]) -> bool:
    """True when an affine `e` takes every integer between its bounds over `ranges`: some
    unit-coefficient variable spans at least the largest step of the other terms, so the shifted
    copies of its range leave no gaps."""
    if not e.is_affine:
        return False
    if not e.terms:
        return True
    steps = [abs(k) for _, k in e.terms]
    for n, (atom, k) in enumerate(e.terms):
        if abs(k) != 1:
            continue
        lo, hi = ranges[atom.name]
        others = [s for m, s in enumerate(steps) if m != n and _span(e.terms[m][0], ranges) > 0]
        if not others or hi - lo + 1 >= max(others):
            return True
    return False


def _span(atom: Atom, ranges: dict[str, Interval]) -> int:
    lo, hi = ranges[atom.name]
    return hi - lo


# ---- simplification ---------------------------------------------------------------------


def floordiv(x: Lin | int, k: int, ranges: dict[str, Interval] | None = None) -> Lin:
    """x // k, simplified: terms whose coefficient k divides come out of the division when the
    remainder's range lies in [0, k) (always when `ranges` says so; reshapes produce these)."""
    x = as_lin(x)
    if k <= 0:
        raise ValueError("floordiv by a positive constant only")
    if k == 1:
        return x
    if x.is_const:
        return const(x.const // k)
    outer = [(a, c // k) for a, c in x.terms if c % k == 0]
    rest = Lin.make([(a, c) for a, c in x.terms if c % k != 0], 0)
    q, r = divmod(x.const, k)
    rest = rest + r
    if ranges is not None:
        (lo, hi), _ = bounds(rest, ranges)
        if 0 <= lo and hi < k:
            return Lin.make(outer, q)
        g = _common_step(x, k, ranges)
        if g > 1:  # x = g * y + s with s in [0, g) and g | k: x // k == y // (k / g)
            return floordiv(_steps(x, g), k // g, ranges)
    if rest.is_const:
        return Lin.make(outer, q + rest.const // k)
    return Lin.make(outer + [(FloorDiv(rest, k), 1)], q)


def mod(x: Lin | int, k: int, ranges: dict[str, Interval] | None = None) -> Lin:
    """x % k, simplified: terms with coefficients divisible by k vanish; the remainder stays
    unwrapped when its range lies in [0, k)."""
    x = as_lin(x)
    if k <= 0:
        raise ValueError("mod by a positive constant only")
    if k == 1:
        return const(0)
    rest = Lin.make([(a, c % k) for a, c in x.terms if c % k != 0], x.const % k)
    if rest.is_const:
        return const(rest.const % k)
    if ranges is not None:
        (lo, hi), _ = bounds(rest, ranges)
        if 0 <= lo and hi < k:
            return rest
        g = _common_step(rest, k, ranges)
        if g > 1:  # x = g * y + s with s in [0, g) and g | k: x % k == g * (y % (k / g)) + s
            return mod(_steps(rest, g), k // g, ranges) * g + _below(rest, g)
    return Lin(((Mod(rest, k), 1),), 0)


def _common_step(x: Lin, k: int, ranges: dict[str, Interval]) -> int:
    """The largest g (1 < g < k, g | k) that splits `x` as g * y + s with s = the terms whose coefficient g
    does not divide, plus x's constant mod g, in [0, g) over `ranges`; 1 where there is none. Candidates are
    gcd(k, the j largest coefficients), j = 1, 2, ... (a row-major offset's strides: `32 * i1 + i2` over
    i2 < 32 is 32 * i1 + s, so its // 128 is i1 // 4, constant along i2)."""
    g = k
    for _, c in sorted(x.terms, key=lambda t: -abs(t[1])):
        g = math.gcd(g, c)
        if g == 1:
            return 1
        if g < k:
            (lo, hi), _ = bounds(_below(x, g), ranges)
            if 0 <= lo and hi < g:
                return g  # the candidates only shrink: the first that splits is the largest
    return 1


def _steps(x: Lin, g: int) -> Lin:
    """y of x = g * y + s (`_common_step`): the terms g divides, over g, and the constant's quotient."""
    return Lin.make([(a, c // g) for a, c in x.terms if c % g == 0], x.const // g)


def _below(x: Lin, g: int) -> Lin:
    """s of x = g * y + s (`_common_step`): the terms g does not divide and the constant mod g."""
    return Lin.make([(a, c) for a, c in x.terms if c % g != 0], x.const % g)


def imin(a: Lin | int, b: Lin | int) -> Lin:
    a, b = as_lin(a), as_lin(b)
    if a.is_const and b.is_const:
        return const(min(a.const, b.const))
    return as_lin(Min(a, b))


def imax(a: Lin | int, b: Lin | int) -> Lin:
    a, b = as_lin(a), as_lin(b)
    if a.is_const and b.is_const:
        return const(max(a.const, b.const))
    return as_lin(Max(a, b))


def iabs(x: Lin | int) -> Lin:
    x = as_lin(x)
    if x.is_const:
        return const(abs(x.const))
    return as_lin(Abs(x))


def simplify(e: Lin, ranges: dict[str, Interval]) -> Lin:
    """Re-simplify nested floordiv/mod atoms with known variable ranges (bottom-up)."""
    out = const(e.const)
    for atom, k in e.terms:
        if isinstance(atom, FloorDiv):
            inner = simplify(atom.x, ranges)
            out = out + floordiv(inner, atom.k, ranges) * k
        elif isinstance(atom, Mod):
            inner = simplify(atom.x, ranges)
            out = out + mod(inner, atom.k, ranges) * k
        elif isinstance(atom, Min):
            out = out + imin(simplify(atom.a, ranges), simplify(atom.b, ranges)) * k
        elif isinstance(atom, Max):
            out = out + imax(simplify(atom.a, ranges), simplify(atom.b, ranges)) * k
        elif isinstance(atom, Abs):
            inner = simplify(atom.x, ranges)
            (lo, hi), _ = bounds(inner, ranges)
            out = out + (inner if lo >= 0 else (-inner if hi <= 0 else iabs(inner))) * k
        elif isinstance(atom, Indirect):
            idx = tuple(simplify(i, ranges) for i in atom.index)
            out = out + as_lin(Indirect(atom.tensor, idx, atom.size)) * k
        else:
            out = out + as_lin(atom) * k
    return out


def join_divmod(e: Lin) -> Lin:
    """`e` with each pair of terms c * k * (x // k) + c * (x % k) replaced by c * x (floor division and its
    modulo: k * (x // k) + x % k == x for every integer x), repeated while pairs remain (a flat offset over
    an axis split in two, then one of the parts in two again)."""
    while True:
        coeff = dict(e.terms)
        for atom, c in e.terms:
            if isinstance(atom, FloorDiv):
                m = Mod(atom.x, atom.k)
                if m in coeff and c == coeff[m] * atom.k:
                    rest = [(a, k) for a, k in e.terms if a != atom and a != m]
                    e = Lin.make(rest, e.const) + atom.x * coeff[m]
                    break
        else:
            return e


def substitute(e: Lin, mapping: dict[str, Lin]) -> Lin:
    """Replace variables by expressions (used to compose index maps when fusing layout stages)."""
    out = const(e.const)
    for atom, k in e.terms:
        out = out + _subst_atom(atom, mapping) * k
    return out


def _subst_atom(atom: Atom, mapping: dict[str, Lin]) -> Lin:
    if isinstance(atom, Var):
        return mapping.get(atom.name, as_lin(atom))
    if isinstance(atom, FloorDiv):
        return floordiv(substitute(atom.x, mapping), atom.k)
    if isinstance(atom, Mod):
        return mod(substitute(atom.x, mapping), atom.k)
    if isinstance(atom, Min):
        return imin(substitute(atom.a, mapping), substitute(atom.b, mapping))
    if isinstance(atom, Max):
        return imax(substitute(atom.a, mapping), substitute(atom.b, mapping))
    if isinstance(atom, Abs):
        return iabs(substitute(atom.x, mapping))
    if isinstance(atom, Indirect):
        return as_lin(Indirect(atom.tensor, tuple(substitute(i, mapping) for i in atom.index), atom.size))
    raise TypeError(atom)


def rename_tensor(e: Lin, old: str, new: str) -> Lin:
    """Rename a tensor referenced by Indirect atoms."""
    out = const(e.const)
    for atom, k in e.terms:
        out = out + _rename_atom(atom, old, new) * k
    return out


def _rename_atom(atom: Atom, old: str, new: str) -> Lin:
    if isinstance(atom, Var):
        return as_lin(atom)
    if isinstance(atom, (FloorDiv, Mod)):
        return as_lin(type(atom)(rename_tensor(atom.x, old, new), atom.k))
    if isinstance(atom, (Min, Max)):
        return as_lin(type(atom)(rename_tensor(atom.a, old, new), rename_tensor(atom.b, old, new)))
    if isinstance(atom, Abs):
        return as_lin(Abs(rename_tensor(atom.x, old, new)))
    if isinstance(atom, Indirect):
        t = new if atom.tensor == old else atom.tensor
        return as_lin(Indirect(t, tuple(rename_tensor(i, old, new) for i in atom.index), atom.size))
    raise TypeError(atom)


hash_once(Var, FloorDiv, Mod, Min, Max, Abs, Indirect, Lin)



def evaluate(e: Lin, env: dict) -> object:
    """`e` (an index) at every position of `env` (variable name -> 1-D integer numpy array, all of one length),
    as the IR defines it (floor division and modulo); None where it needs a variable `env` lacks or a value
    read through a tensor (Indirect)."""
    import numpy as np

    if not env:
        return None
    out = np.full(len(next(iter(env.values()))), e.const, dtype=np.int64)
    for atom, k in e.terms:
        v = _evaluate_atom(atom, env)
        if v is None:
            return None
        out = out + k * v
    return out


def _evaluate_atom(atom: Atom, env: dict) -> object:
    import numpy as np

    if isinstance(atom, Var):
        return env.get(atom.name)
    if isinstance(atom, (FloorDiv, Mod, Abs)):
        x = evaluate(atom.x, env)
        if x is None:
            return None
        return np.floor_divide(x, atom.k) if isinstance(atom, FloorDiv) else np.mod(x, atom.k) \
            if isinstance(atom, Mod) else np.abs(x)
    if isinstance(atom, (Min, Max)):
        a, b = evaluate(atom.a, env), evaluate(atom.b, env)
        if a is None or b is None:
            return None
        return np.minimum(a, b) if isinstance(atom, Min) else np.maximum(a, b)
    return None  # a value read through a tensor
