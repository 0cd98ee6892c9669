"""Tests for engine/ir/index.py: canonical form, reshape simplification to affine indices, and
interval bounds (always a hull of the attained values; tight where `exact` says so)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.ir import index as I

i0, i1, i2 = I.out_vars(3)


def test_canonical_form_merges_and_orders_terms():
    assert i1 + i0 + i1 - i1 * 2 == i0  # merged, zero terms dropped
    assert (i1 + 3 + i0) == (i0 + i1 + 3)
    assert str(i0 * 2 - i1 + 1) == "2*i0 - i1 + 1"


def test_merge_then_split_reshape_is_affine():
    # [2, 3] -> [6] -> [2, 3]: flat = 3*i0 + i1, then (flat // 3, flat % 3) collapses back to (i0, i1).
    ranges = {"i0": (0, 1), "i1": (0, 2)}
    flat = i0 * 3 + i1
    assert I.floordiv(flat, 3, ranges) == i0
    assert I.mod(flat, 3, ranges) == i1
    # Without ranges the remainder may wrap, so the atoms stay.
    assert not I.floordiv(flat, 3).is_affine


def test_split_after_merge_composes_through_substitute():
    # out[j] of a [6] view of x[2,3] reads x[j // 3, j % 3]; substituting j = 3*i0 + i1 simplifies to (i0, i1).
    j = I.var("j")
    view = (I.floordiv(j, 3), I.mod(j, 3))
    ranges = {"i0": (0, 1), "i1": (0, 2)}
    composed = tuple(I.simplify(I.substitute(e, {"j": i0 * 3 + i1}), ranges) for e in view)
    assert composed == (i0, i1)


def test_bounds_exactness_rules():
    ranges = {"i0": (0, 3), "i1": (2, 5)}
    assert I.bounds(i0 * 2 - i1 + 7, ranges) == ((2, 11), True)
    assert I.bounds(I.mod(i0 + 4, 8), ranges) == ((4, 7), True)  # no wrap: monotone
    (lo, hi), exact = I.bounds(I.mod(i1, 4), ranges)  # 2..5 wraps at 4 and covers 0..3
    assert (lo, hi) == (0, 3) and exact
    assert I.bounds(I.mod(i0 * 2, 4), {"i0": (0, 3)}) == ((0, 3), False)  # {0, 2}: a safe hull only
    gathered = I.as_lin(I.Indirect("idx", (i0,), 10))
    assert I.bounds(gathered, ranges) == ((0, 9), False)


def _terms():
    var = st.sampled_from([i0, i1, i2])
    affine = st.builds(
        lambda a, b, x, y, c: a * x + b * y + c,
        st.integers(-3, 3),
        st.integers(-3, 3),
        var,
        var,
        st.integers(-5, 5),
    )
    return st.one_of(
        affine,
        st.builds(lambda e, k: I.floordiv(e, k), affine, st.integers(1, 4)),
        st.builds(lambda e, k: I.mod(e, k), affine, st.integers(1, 4)),
        st.builds(I.imin, affine, affine),
        st.builds(I.imax, affine, affine),
        st.builds(I.iabs, affine),
    )


EXPRS = st.builds(lambda a, b, c: a + b * c, _terms(), _terms(), st.integers(-2, 2))
BOXES = st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 3)), min_size=3, max_size=3)


def _attained(e: I.Lin, ranges: dict) -> set[int]:
    grid = itertools.product(*[range(lo, hi + 1) for lo, hi in ranges.values()])
    return {evaluate(e, dict(zip(ranges, p))) for p in grid}


@settings(max_examples=60, deadline=None)
@given(e=EXPRS, box=BOXES)
def test_bounds_hull_and_simplify_against_enumeration(e, box):
    ranges = {f"i{k}": (lo, lo + n) for k, (lo, n) in enumerate(box)}
    values = _attained(e, ranges)
    (lo, hi), _ = I.bounds(e, ranges)
    assert lo <= min(values) and max(values) <= hi
    simple = I.simplify(e, ranges)
    grid = list(itertools.product(*[range(a, b + 1) for a, b in ranges.values()]))
    assert all(evaluate(simple, dict(zip(ranges, p))) == evaluate(e, dict(zip(ranges, p))) for p in grid)


@settings(max_examples=60, deadline=None)
@given(e=EXPRS, box=BOXES)
def test_exact_bounds_are_tight(e, box):
    ranges = {f"i{k}": (lo, lo + n) for k, (lo, n) in enumerate(box)}
    values = _attained(e, ranges)
    (lo, hi), exact = I.bounds(e, ranges)
    if exact:
        assert (lo, hi) == (min(values), max(values))


def test_abs_with_degenerate_unit_variable_is_not_exact():
    e = I.iabs(-i0 + i1 * 2 + 1)
    ranges = {"i0": (2, 2), "i1": (0, 1)}
    assert _attained(e, ranges) == {1}
    assert I.bounds(e, ranges) in (((1, 1), True), ((0, 1), False))


def evaluate(e: I.Lin, env: dict[str, int]) -> int:
    total = e.const
    for atom, k in e.terms:
        if isinstance(atom, I.Var):
            v = env[atom.name]
        elif isinstance(atom, I.FloorDiv):
            v = evaluate(atom.x, env) // atom.k
        elif isinstance(atom, I.Mod):
            v = evaluate(atom.x, env) % atom.k
        elif isinstance(atom, I.Min):
            v = min(evaluate(atom.a, env), evaluate(atom.b, env))
        elif isinstance(atom, I.Max):
            v = max(evaluate(atom.a, env), evaluate(atom.b, env))
        elif isinstance(atom, I.Abs):
            v = abs(evaluate(atom.x, env))
        else:
            raise TypeError(atom)
        total += k * v
    return total


@settings(max_examples=80, deadline=None)
@given(x=EXPRS, k=st.integers(2, 6), j=st.integers(2, 4), c=st.integers(-3, 3), rest=EXPRS)
def test_join_divmod_keeps_the_value_and_joins_split_axes(x, k, j, c, rest):
    """A flat row-major offset over an axis x split in two, (x // k, x % k), then the quotient split again by
    j: join_divmod gives x back (times the coefficient), and any expression keeps its value everywhere."""
    q = I.floordiv(x, k)
    split = (I.floordiv(q, j) * j + I.mod(q, j)) * k + I.mod(x, k)
    e = split * c + rest
    joined = I.join_divmod(e)
    box = {"i0": (-4, 4), "i1": (-3, 3), "i2": (0, 5)}
    for p in itertools.product(*[range(lo, hi + 1) for lo, hi in box.values()]):
        env = dict(zip(box, p))
        assert evaluate(joined, env) == evaluate(e, env)
    # Where x is as floordiv and mod leave it (coefficients and constant in [0, k): mod reduces them mod k,
    # and the pair then names different expressions — still the same values), the split is joined away.
    plain = all(isinstance(a, I.Var) and 0 < coef < k for a, coef in x.terms) and 0 <= x.const < k and x.terms
    if c and plain and not any(isinstance(a, (I.FloorDiv, I.Mod)) for a, _ in rest.terms):
        assert not any(isinstance(a, (I.FloorDiv, I.Mod)) for a, _ in joined.terms)
        assert joined == x * c + rest
    assert I.join_divmod(i2 + 3) == i2 + 3


@settings(max_examples=120, deadline=None)
@given(extents=st.lists(st.integers(1, 5), min_size=3, max_size=3), lows=st.lists(st.integers(-2, 2), min_size=3,
       max_size=3), shift=st.integers(-40, 40), k_at=st.integers(0, 3), k_times=st.integers(1, 3),
       sign=st.sampled_from([1, -1]))
def test_common_step_rule_keeps_floordiv_and_mod_values(extents, lows, shift, k_at, k_times, sign):
    """A row-major offset (strides the products of the inner extents) plus a constant, divided by a stride
    times a small factor: floordiv and mod with ranges take the common step out (`(32 * i1 + i2) // 128` over
    i2 < 32 is `i1 // 4`) and keep every value, for ranges that start below zero too and either sign."""
    strides = [extents[1] * extents[2], extents[2], 1]
    x = (i0 * strides[0] + i1 * strides[1] + i2 * strides[2]) * sign + shift
    k = ([1] + strides[::-1] + [extents[0] * strides[0]])[k_at] * k_times + (k_at == 0)
    ranges = {f"i{n}": (lo, lo + ext - 1) for n, (lo, ext) in enumerate(zip(lows, extents))}
    q, r = I.floordiv(x, k, ranges), I.mod(x, k, ranges)
    for p in itertools.product(*[range(lo, hi + 1) for lo, hi in ranges.values()]):
        env = dict(zip(ranges, p))
        assert evaluate(q, env) == evaluate(x, env) // k
        assert evaluate(r, env) == evaluate(x, env) % k


def test_common_step_rule_on_a_split_row_major_offset():
    """swin's cyclic shift read a window index as `(32 * i1 + i2) // 128` with i2 < 32: constant along i2."""
    ranges = {"i0": (0, 15), "i1": (0, 15), "i2": (0, 31)}
    assert I.floordiv(i1 * 32 + i2, 128, ranges) == I.floordiv(i1, 4)
    assert I.floordiv(i0 * 512 + i1 * 32 + i2, 2048, ranges) == I.floordiv(i0, 4)
    assert I.mod(i1 * 32 + i2, 128, ranges) == I.mod(i1, 4) * 32 + i2
    assert I.floordiv(i1 * 32 + i2, 128) != I.floordiv(i1, 4)  # without ranges i2 may pass 31
    assert I.floordiv(i1 * 32 + i2 + 32, 128, {**ranges, "i2": (0, 32)}) == I.floordiv(i1 * 32 + i2 + 32, 128)
