"""Property tests for engine/tilegraph/propagate.py against brute force: perturb each input element,
re-evaluate the output box with the reference executor, and check that every element that changes
an output lies in the propagated box, and that an `exact` region is the tight bounding box."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine, Stage, StageKind
from engine.runtime.reference import eval_stage
from engine.tilegraph.propagate import Region, box_size, full_box, propagate

F32 = DType.F32
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
dims = st.integers(1, 4)


def load(name: str, index, pad=None) -> E.Load:
    return E.Load(name, tuple(I.as_lin(i) for i in index), F32, pad)


def reshape_index(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> tuple[I.Lin, ...]:
    """x[...] read by out[i] of a row-major reshape: flat offset, then // stride % extent per axis
    (what the Reshape converter emits; kept here so these tests depend on the IR only)."""
    ranges = {f"i{k}": (0, n - 1) for k, n in enumerate(out_shape)}
    flat = sum((v * int(np.prod(out_shape[k + 1:])) for k, v in enumerate(I.out_vars(len(out_shape)))), I.const(0))
    index = []
    for k, n in enumerate(in_shape):
        e = I.simplify(I.floordiv(flat, int(np.prod(in_shape[k + 1:])), ranges), ranges)
        index.append(I.simplify(I.mod(e, n, ranges), ranges) if n > 1 else I.const(0))
    return tuple(index)


def randn(rng: np.random.Generator, shape) -> np.ndarray:
    # Magnitudes in [0.5, 1.5]: no value is near zero, so every product term is visible.
    return np.asarray(rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape), dtype=np.float32)


# ---- stage builders: (stage, env, reduce_box) ---------------------------------------------


@st.composite
def elementwise_case(draw, rng):
    shape = tuple(draw(st.lists(dims, min_size=1, max_size=3)))
    iv = I.out_vars(len(shape))
    keep = draw(st.integers(0, len(shape)))  # b drops leading axes and broadcasts some of the rest
    bshape = tuple(d if draw(st.booleans()) else 1 for d in shape[len(shape) - keep:])
    bindex = [iv[len(shape) - keep + k] if d > 1 or shape[len(shape) - keep + k] == 1 else I.const(0)
              for k, d in enumerate(bshape)]
    op = draw(st.sampled_from(["add", "mul", "max"]))
    body = E.binary(op, load("a", iv), E.binary("add", load("b", bindex), E.imm(0.25)))
    stage = Stage("out", StageKind.ELEMENTWISE, shape, F32, body, op=op)
    return stage, {"a": randn(rng, shape), "b": randn(rng, bshape)}, None


@st.composite
def reduce_case(draw, rng):
    shape = tuple(draw(st.lists(dims, min_size=1, max_size=3)))
    axes = sorted(draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)))
    keepdims = draw(st.booleans())
    out_shape, index, nout, nred = [], [], 0, 0
    for k, d in enumerate(shape):
        if k in axes:
            index.append(I.var(f"r{nred}"))
            nred += 1
            if keepdims:
                out_shape.append(1)
                nout += 1
        else:
            index.append(I.var(f"i{nout}"))
            out_shape.append(d)
            nout += 1
    combine = draw(st.sampled_from([Combine.SUM, Combine.MAX, Combine.MIN]))
    reduce = tuple(shape[a] for a in axes)
    stage = Stage("out", StageKind.REDUCE, tuple(out_shape), F32, load("x", index), reduce, combine, op="reduce")
    return stage, {"x": randn(rng, shape)}, draw(sub_box(reduce))


@st.composite
def matmul_case(draw, rng):
    b, m, k, n = draw(dims), draw(dims), draw(dims), draw(dims)
    body = E.mul(load("A", (I.var("i0"), I.var("i1"), I.var("r0"))), load("B", (I.var("r0"), I.var("i2"))))
    stage = Stage("out", StageKind.CONTRACTION, (b, m, n), F32, body, (k,), Combine.SUM, op="matmul")
    return stage, {"A": randn(rng, (b, m, k)), "B": randn(rng, (k, n))}, draw(sub_box((k,)))


@st.composite
def conv_case(draw, rng, padded: bool = False):
    c, co = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    s, d, p = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 2)) if padded else 0
    h = draw(st.integers(max(1, d * (kh - 1) + 1 - 2 * p), 6))
    w = draw(st.integers(max(1, d * (kw - 1) + 1 - 2 * p), 6))
    oh, ow = (h + 2 * p - d * (kh - 1) - 1) // s + 1, (w + 2 * p - d * (kw - 1) - 1) // s + 1
    i, r = I.out_vars(4), I.red_vars(3)
    x = load("x", (i[0], r[0], i[2] * s + r[1] * d - p, i[3] * s + r[2] * d - p), pad=0.0)
    body = E.mul(x, load("w", (i[1], r[0], r[1], r[2])))
    stage = Stage("out", StageKind.CONTRACTION, (1, co, oh, ow), F32, body, (c, kh, kw), Combine.SUM, op="conv")
    return stage, {"x": randn(rng, (1, c, h, w)), "w": randn(rng, (co, c, kh, kw))}, None


@st.composite
def transpose_case(draw, rng):
    shape = tuple(draw(st.lists(dims, min_size=2, max_size=3)))
    perm = draw(st.permutations(range(len(shape))))
    iv = I.out_vars(len(shape))
    index = [iv[perm.index(k)] for k in range(len(shape))]  # out[i] = x[i permuted back]
    out_shape = tuple(shape[p] for p in perm)
    stage = Stage("out", StageKind.LAYOUT, out_shape, F32, load("x", index), op="transpose")
    return stage, {"x": randn(rng, shape)}, None


@st.composite
def reshape_case(draw, rng):
    factors = draw(st.lists(st.integers(1, 3), min_size=2, max_size=4))

    def group(cuts):
        out, acc = [], 1
        for k, f in enumerate(factors):
            acc *= f
            if k == len(factors) - 1 or k in cuts:
                out.append(acc)
                acc = 1
        return tuple(out)

    in_shape = group(draw(st.sets(st.integers(0, len(factors) - 2))))
    out_shape = group(draw(st.sets(st.integers(0, len(factors) - 2))))
    stage = Stage("out", StageKind.LAYOUT, out_shape, F32, load("x", reshape_index(in_shape, out_shape)), op="reshape")
    return stage, {"x": randn(rng, in_shape)}, None


@st.composite
def slice_case(draw, rng):
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=2)))
    axis = draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    start, step = draw(st.integers(0, n - 1)), draw(st.sampled_from([1, 2, 3, -1, -2]))
    most = (n - 1 - start) // step + 1 if step > 0 else start // -step + 1
    length = draw(st.integers(1, most))
    iv = I.out_vars(len(shape))
    index = [iv[k] * step + start if k == axis else iv[k] for k in range(len(shape))]
    out_shape = tuple(length if k == axis else d for k, d in enumerate(shape))
    stage = Stage("out", StageKind.LAYOUT, out_shape, F32, load("x", index), op="slice")
    return stage, {"x": randn(rng, shape)}, None


@st.composite
def concat_case(draw, rng):
    rank = draw(st.integers(1, 3))
    base = draw(st.lists(dims, min_size=rank, max_size=rank))
    axis = draw(st.integers(0, rank - 1))
    sizes = draw(st.lists(dims, min_size=2, max_size=3))
    iv = I.out_vars(rank)
    names = [f"x{k}" for k in range(len(sizes))]
    offsets = np.cumsum([0] + sizes).tolist()
    body = None
    for k in reversed(range(len(sizes))):  # the same Select-of-guarded-loads the Concat converter builds
        index = [v - offsets[k] if d == axis else v for d, v in enumerate(iv)]
        ld = load(names[k], index, pad=0.0)
        body = ld if body is None else E.select(
            E.binary("lt", E.index_val(iv[axis]), E.imm(offsets[k + 1], DType.I64)), ld, body)
    shape = tuple(offsets[-1] if d == axis else n for d, n in enumerate(base))
    env = {nm: randn(rng, tuple(sz if d == axis else n for d, n in enumerate(base))) for nm, sz in zip(names, sizes)}
    return Stage("out", StageKind.LAYOUT, shape, F32, body, op="concat"), env, None


@st.composite
def pad_case(draw, rng):
    shape = tuple(draw(st.lists(dims, min_size=1, max_size=2)))
    before = draw(st.lists(st.integers(0, 2), min_size=len(shape), max_size=len(shape)))
    after = draw(st.lists(st.integers(0, 2), min_size=len(shape), max_size=len(shape)))
    iv = I.out_vars(len(shape))
    out_shape = tuple(d + b + a for d, b, a in zip(shape, before, after))
    body = load("x", [v - b for v, b in zip(iv, before)], pad=0.0)
    return Stage("out", StageKind.LAYOUT, out_shape, F32, body, op="pad"), {"x": randn(rng, shape)}, None


@st.composite
def gather_case(draw, rng):
    rows, cols = draw(st.integers(2, 5)), draw(dims)
    ishape = tuple(draw(st.lists(dims, min_size=1, max_size=2)))
    axis = draw(st.integers(0, 1))
    iv = I.out_vars(len(ishape) + 1)
    size = (rows, cols)[axis]
    if size < 2:
        size, rows, cols = 2, max(rows, 2), max(cols, 2)
    if axis == 0:
        sel = I.as_lin(I.Indirect("idx", tuple(iv[:-1]), rows))
        index, out_shape = (sel, iv[-1]), ishape + (cols,)
    else:
        sel = I.as_lin(I.Indirect("idx", tuple(iv[1:]), cols))
        index, out_shape = (iv[0], sel), (rows,) + ishape
    env = {"data": randn(rng, (rows, cols)), "idx": rng.integers(0, (rows, cols)[axis], ishape).astype(np.int64)}
    return Stage("out", StageKind.LAYOUT, out_shape, F32, load("data", index), op="gather"), env, None


@st.composite
def sub_box(draw, shape):
    if draw(st.booleans()):
        return None
    box = []
    for n in shape:
        lo = draw(st.integers(0, n - 1))
        box.append((lo, draw(st.integers(lo + 1, n))))
    return tuple(box)


CASES = {
    "elementwise": elementwise_case, "reduce": reduce_case, "matmul": matmul_case, "conv": conv_case,
    "conv_pad": lambda rng: conv_case(rng, padded=True),
    "transpose": transpose_case, "reshape": reshape_case, "slice": slice_case, "concat": concat_case,
    "pad": pad_case, "gather": gather_case,
}


# ---- brute force ----------------------------------------------------------------------------


def index_sizes(stage: Stage) -> dict[str, int]:
    from engine.ir.graph import PrimGraph
    from engine.runtime.inputs import index_limits

    return index_limits(PrimGraph("t", (), (), (stage,), (stage.name,)))


def affecting(stage: Stage, env: dict, tensor: str, ranges: dict) -> set[tuple[int, ...]]:
    """Elements of `tensor` whose change alters some output in `ranges`."""
    base = eval_stage(stage, env, ranges)
    arr = env[tensor]
    size = index_sizes(stage).get(tensor)
    hits = set()
    for pos in np.ndindex(arr.shape):
        if arr.dtype.kind == "f":
            variants = (arr[pos] + 1e3, arr[pos] - 1e3)
        else:
            variants = ((arr[pos] + 1) % size, (arr[pos] - 1) % size)
        for v in variants:
            changed = arr.copy()
            changed[pos] = v
            out = eval_stage(stage, {**env, tensor: changed}, ranges)
            if not np.array_equal(out, base, equal_nan=True):
                hits.add(pos)
                break
    return hits


def check_case(stage: Stage, env: dict, out_box, reduce_box) -> None:
    shapes = {k: v.shape for k, v in env.items()}
    prop = propagate(stage, out_box, shapes, reduce_box)
    assert set(prop.regions) == set(stage.inputs)
    ranges = {f"i{k}": b for k, b in enumerate(out_box)}
    ranges.update({f"r{k}": b for k, b in enumerate(reduce_box or full_box(stage.reduce))})
    for tensor in stage.inputs:
        region: Region = prop.regions[tensor]
        # A read multiplied by another operand's padded zero (conv halo) is still a read, just not a
        # dependence, so brute force cannot see it: only containment is checked then.
        masked = any(isinstance(n, E.Load) and n.pad is not None and n.tensor != tensor for n in E.walk(stage.body))
        hits = affecting(stage, env, tensor, ranges)
        if not hits:
            assert masked or region.box is None or not region.exact, (tensor, region)
            continue
        assert region.box is not None, (tensor, sorted(hits))
        for pos in hits:
            assert all(lo <= p < hi for p, (lo, hi) in zip(pos, region.box)), (tensor, pos, region.box)
        if region.exact and not masked:
            tight = tuple((min(p[d] for p in hits), max(p[d] for p in hits) + 1) for d in range(len(region.box)))
            assert tight == region.box, (tensor, "exact region is not tight", tight, region.box)


def draw_case(data, kind: str):
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    stage, env, reduce_box = data.draw(CASES[kind](np.random.default_rng(seed)), label=kind)
    out_box = data.draw(sub_box(stage.shape).map(lambda b: b or full_box(stage.shape)), label="out_box")
    return stage, env, out_box, reduce_box


KINDS = list(CASES)


@pytest.mark.parametrize("kind", KINDS)
@FAST
@given(data=st.data())
def test_propagation_covers_brute_force(kind, data):
    check_case(*draw_case(data, kind))


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@SLOW
@given(data=st.data())
def test_propagation_covers_brute_force_many(kind, data):
    check_case(*draw_case(data, kind))


# ---- exactness where the rules promise it -----------------------------------------------------


@pytest.mark.parametrize("kind", ["elementwise", "matmul", "transpose", "slice", "pad", "concat"])
@FAST
@given(data=st.data())
def test_affine_reads_are_exact(kind, data):
    stage, env, out_box, reduce_box = draw_case(data, kind)
    prop = propagate(stage, out_box, {k: v.shape for k, v in env.items()}, reduce_box)
    assert prop.exact, prop


def test_gather_data_is_conservative_and_indices_exact():
    iv = I.out_vars(2)
    body = load("data", (I.as_lin(I.Indirect("idx", (iv[0],), 7)), iv[1]))
    stage = Stage("g", StageKind.LAYOUT, (5, 3), F32, body, op="gather")
    prop = propagate(stage, ((1, 3), (0, 2)), {"data": (7, 3), "idx": (5,)})
    assert prop.regions["data"] == Region(((0, 7), (0, 2)), False)
    assert prop.regions["idx"] == Region(((1, 3),), True)


def test_empty_box_reads_nothing():
    stage = Stage("t", StageKind.LAYOUT, (3, 2), F32, load("x", (I.var("i1"), I.var("i0"))), op="transpose")
    prop = propagate(stage, ((1, 1), (0, 2)))
    assert prop.regions["x"].box is None and box_size(prop.regions["x"].box) == 0


def test_propagate_many_gives_propagate_s_boxes_row_for_row():
    """Every stage of the samples and the zoo's bert (reshapes, transposes, gathers, pads, reductions)
    under random tile boxes, empty ones included: the array form gives each row the box `propagate`
    gives that box, and no box where it gives none."""
    from support import SAMPLES

    from engine.api import load_graph
    from engine.tilegraph.propagate import propagate_many

    ZOO = SAMPLES / "zoo"

    rng = np.random.default_rng(7)
    checked = 0
    for path in [*sorted(SAMPLES.glob("*.onnx")), ZOO / "bert.onnx"]:
        graph = load_graph(path)
        shapes = {k: v.shape for k, v in graph.specs.items()}
        for stage in graph.stages:
            rows = []
            for _ in range(6):
                lo = [int(rng.integers(0, n)) for n in stage.shape]
                rows.append(tuple((a, int(rng.integers(a, n + 1))) for a, n in zip(lo, stage.shape)))
            lo = np.array([[a for a, _ in b] for b in rows], dtype=np.int64).reshape(len(rows), len(stage.shape))
            hi = np.array([[b for _, b in b_] for b_ in rows], dtype=np.int64).reshape(len(rows), len(stage.shape))
            many = propagate_many(stage, (lo, hi), shapes)
            for j, box in enumerate(rows):
                one = propagate(stage, box, shapes)
                for t in stage.inputs:
                    mlo, mhi = many[t]
                    got = tuple(zip(mlo[j].tolist(), mhi[j].tolist())) if np.all(mhi[j] > mlo[j]) else None
                    assert got == one.box(t), (path.name, stage.name, t, box)
                    checked += 1
    assert checked > 1000
