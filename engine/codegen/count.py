"""Work count of the kernel IR: a Kernel (or one Segment of it) in, the arithmetic and the global and
shared-memory accesses of the code the CUDA printer renders for it out, summed over every tile — with
how often each stage's value is evaluated (Inlined provenance) and the deepest loop nest per element.

It walks the IR as the base printer does (engine/codegen/printer.py): one SSA value per distinct
subexpression per element, loop-invariant values hoisted out of reduction loops, guarded values
evaluated inside their guard, tiled GEMMs and direct convolutions staged per k step, threads padded to
the micro-tile grid. The cost model (engine/schedule/cost.py) reads these counts instead of its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from engine.codegen.kexpr import Guard, InBounds, Inlined, Reduce, kchildren, kwalk, strip
from engine.codegen.kir import Kernel, Phase, Region, Scope, Segment
from engine.errors import PlanError
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine
from engine.memo import memo


@dataclass
class Work:
    """Counts of one kernel (or segment) over all its tiles. `evals[stage]`: elements of `stage`
    computed (a value inlined at every use counts once per use); `nest`: the largest product of loop
    extents around one statement per element of its phase (the phase's own reduction or k loop
    included) — the work one thread spends on one output element."""

    flops: float = 0.0
    tiled_flops: float = 0.0  # of `flops`: the multiply-adds of tiled GEMM and direct-conv micro-tiles
    mma_flops: float = 0.0  # of `flops`: the multiply-adds of tiled GEMMs on tensor cores (Gemm.mma)
    mma_f16_flops: float = 0.0  # of `mma_flops`: those with fp16 or bf16 operands (m16n8k16; the rest are TF32)
    global_load: float = 0.0  # bytes
    global_store: float = 0.0
    shared_load: float = 0.0
    shared_store: float = 0.0
    evals: dict = field(default_factory=dict)
    nest: int = 1
    # Of `flops`: those run inside a reduction loop, keyed by the trip count of its innermost loop (the
    # loop the C target vectorises: `omp simd reduction`), sums the C target runs column-wise left out.
    loop_flops: dict = field(default_factory=dict)
    op_flops: dict = field(default_factory=dict)  # of `flops`: per transcendental op (E.OP_FLOPS), its flops

    def add(self, other: Work, times: float = 1.0) -> None:
        self.flops += other.flops * times
        self.tiled_flops += other.tiled_flops * times
        self.mma_flops += other.mma_flops * times
        self.mma_f16_flops += other.mma_f16_flops * times
        self.global_load += other.global_load * times
        self.global_store += other.global_store * times
        self.shared_load += other.shared_load * times
        self.shared_store += other.shared_store * times
        for k, v in other.evals.items():
            self.evals[k] = self.evals.get(k, 0.0) + v * times
        for k, v in other.loop_flops.items():
            self.loop_flops[k] = self.loop_flops.get(k, 0.0) + v * times
        for k, v in other.op_flops.items():
            self.op_flops[k] = self.op_flops.get(k, 0.0) + v * times
        self.nest = max(self.nest, other.nest)

    @property
    def global_bytes(self) -> float:
        return self.global_load + self.global_store

    @property
    def shared_bytes(self) -> float:
        return self.shared_load + self.shared_store

    def to_json(self) -> dict:
        return {"flops": int(self.flops), "tiled_flops": int(self.tiled_flops), "global_load_bytes": int(self.global_load),
                "global_store_bytes": int(self.global_store), "shared_load_bytes": int(self.shared_load),
                "shared_store_bytes": int(self.shared_store), "nest": int(self.nest),
                "evals": {k: int(v) for k, v in sorted(self.evals.items())},
                **({"mma_flops": int(self.mma_flops)} if self.mma_flops else {}),
                **({"mma_f16_flops": int(self.mma_f16_flops)} if self.mma_f16_flops else {})}


def count_kernel(kernel: Kernel) -> Work:
    """Work of every segment of `kernel` over all its tiles."""
    total = Work()
    for seg in kernel.segments:
        total.add(count_segment(kernel, seg))
    return total


def count_program(program) -> dict[str, Work]:
    return {k.name: count_kernel(k) for k in program.kernels}


def count_segment(kernel: Kernel, seg: Segment, tiles: slice | None = None) -> Work:
    """Work of one segment over all its tiles (or the tiles `tiles` selects, numbered row-major)."""
    total = Work()
    for phase in seg.phases:
        total.add(_phase(kernel, phase, kernel.threads, tiles))
    return total


# ---- per-tile sizes ---------------------------------------------------------------------------


def region_bounds_of(region: Region, tiles: slice | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi), each (ntiles, rank): the box of `region` on each tile (row-major tile order)."""
    idx = np.arange(region.ntiles, dtype=np.int64)[tiles if tiles is not None else slice(None)]
    if region.table:
        rows = np.asarray(region.table, dtype=np.int64)[idx]
        return rows[:, :region.rank], rows[:, region.rank:]
    coords, rest = [], idx.copy()
    for k in reversed(region.tiles):
        coords.append(rest % k)
        rest = rest // k
    coords = coords[::-1]
    lo = np.empty((len(idx), region.rank), dtype=np.int64)
    hi = np.empty_like(lo)
    for d, span in enumerate(region.spans):
        a = np.full(len(idx), span.base, dtype=np.int64)
        for c, tc in zip(span.coeffs, coords):
            if c:
                a = a + c * tc
        b = a + span.ext
        if span.clamp:
            a, b = np.maximum(a, 0), np.minimum(b, region.shape[d])
        lo[:, d], hi[:, d] = a, b
    return lo, hi


def region_extents(region: Region, tiles: slice | None = None) -> np.ndarray:
    """(ntiles, rank) live extent of `region` on each tile (row-major tile order)."""
    n = region.ntiles
    idx = np.arange(n, dtype=np.int64)[tiles if tiles is not None else slice(None)]
    if region.table:
        rows = np.asarray(region.table, dtype=np.int64)[idx]
        r = region.rank
        return np.maximum(rows[:, r:] - rows[:, :r], 0)
    if all(not any(sp.coeffs) and not sp.clamp for sp in region.spans):  # one box for every tile
        return np.broadcast_to(np.asarray([sp.ext for sp in region.spans], dtype=np.int64), (len(idx), region.rank))
    lo, hi = region_bounds_of(region, tiles)
    return np.maximum(hi - lo, 0)


def _flat_sizes(region: Region, tiles: slice | None) -> np.ndarray:
    size = math.prod(region.shape)
    idx = np.arange(region.ntiles, dtype=np.int64)[tiles if tiles is not None else slice(None)]
    return np.clip(size - idx * region.flat, 0, region.flat)


# ---- one phase ----------------------------------------------------------------------------------


def _phase(kernel: Kernel, phase: Phase, threads: int, tiles: slice | None) -> Work:
    work = _phase_work(kernel, phase, threads, tiles)
    if phase.owned is not None:  # each element stored to global memory by one tile only
        owned = phase.owned
        elems = float(_flat_sizes(owned, tiles).sum()) if owned.flat else float(
            np.prod(region_extents(owned, tiles), axis=1).sum())
        for name in phase.stores:
            buf = kernel.buffer(name)
            if buf.scope == Scope.GLOBAL:
                work.global_store += elems * buf.dtype.itemsize
    return work


def _phase_work(kernel: Kernel, phase: Phase, threads: int, tiles: slice | None) -> Work:
    if phase.region.flat:
        elems = float(_flat_sizes(phase.region, tiles).sum())
        return _elementwise(kernel, phase, elems)
    ext = region_extents(phase.region, tiles)
    if phase.gemm is not None:
        return _gemm(kernel, phase, ext, threads)
    if phase.conv is not None:
        return _conv(kernel, phase, ext, threads, tiles)
    elems = float(np.prod(ext, axis=1).sum()) if ext.shape[1] else float(len(ext))
    return _elementwise(kernel, phase, elems)


def _memo(kernel: Kernel, root, key: tuple, compute) -> Work:
    """Per-element counts depend only on the expression and the buffers it names (their scope and
    dtype): memoised on the expression object (kept alive beside its entry, so its id stays its own) —
    the cost model counts the same bodies for many candidate tiles."""
    table = memo("count.work", 50000)
    full = (id(root), key, _scopes(kernel))
    hit = table.get(full)
    if hit is None or hit[0] is not root:
        hit = table.put(full, (root, compute()))
    return hit[1]


def _scopes(kernel: Kernel) -> tuple:
    """What a load's bytes depend on besides the expression: each buffer's scope and dtype."""
    table = memo("count.scopes", 1000)
    hit = table.get(id(kernel))
    if hit is None or hit[0] is not kernel:
        hit = table.put(id(kernel), (kernel, tuple(sorted((b.name, b.scope.value, b.dtype.value)
                                                          for b in kernel.params + kernel.locals))))
    return hit[1]


def _elementwise(kernel: Kernel, phase: Phase, elems: float) -> Work:
    """Per element: the body (or the phase's reduction over its reduce axes) and the stores. Values
    under a guard (and padded loads) on the output position count at the share of the phase's positions
    where it holds."""
    guarded = _has_guards(phase.body)
    column = _column_key(phase)  # (innermost axis one wide, ...); () for a flat or rank-0 region
    row = (f"i{phase.region.rank - 1}", float(phase.region.extent[-1])) if (
        phase.combine is None and column and not column[0] and _has_selects(phase.body)) else None

    def compute() -> Work:
        c = _Counter(kernel)
        c.columnwise = _column_sums(kernel, phase)
        if guarded and phase.region.shape:  # over the output positions and, for the phase's own reduction, its terms
            c.positions = _positions(phase.region.shape, tuple(phase.reduce) if phase.combine is not None else ()) or None
        c.row = row
        if phase.combine is None:
            c.value(phase.body, 1.0, {})
        else:
            names = tuple(f"r{k}" for k in range(len(phase.reduce)))
            c.reduction(phase.body, names, phase.reduce, 1.0, {}, columnwise="phase" in c.columnwise)
        c.stores(phase)
        c.work.evals[phase.stage] = c.work.evals.get(phase.stage, 0.0) + 1.0
        return c.work

    # The stores counted per element depend on whether the phase has an owned part (its global stores
    # then counted apart, in `_phase`): part of the key, or one phase's count would answer for the other.
    one = _memo(kernel, phase.body, ("elem", phase.stage, phase.reduce, phase.combine, phase.stores,
                                     phase.owned is None, column,
                                     phase.region.shape if guarded else (), row), compute)
    out = Work()
    out.add(one, elems)
    out.nest = one.nest
    return out


def _column_key(phase: Phase) -> tuple:
    """What the C target's choice of column-wise sums depends on besides the body and the kernel."""
    r = phase.region.rank
    if phase.region.flat or not r:
        return ()
    from engine.codegen.ctarget import MAX_LINE, one_wide

    return (one_wide(phase.region, r - 1), phase.region.extent[r - 1] <= MAX_LINE)


def _column_sums(kernel: Kernel, phase: Phase) -> set:
    """Sums of a per-element phase that the C target runs column-wise (CPrinter.render_phase /
    column_sums: the phase's innermost axis is the vector loop, the sum's loop outside it), unmarked:
    their loops are not the vector loops. The phase itself when it is such a sum (its `whole`)."""
    key = _column_key(phase)
    if not key or key[0] or not key[1]:
        return set()
    from engine.codegen.ctarget import axpy_sums

    r = phase.region.rank
    var = f"i{r - 1}"
    if phase.combine is None:
        return {_strip(n) for n in axpy_sums(kernel, phase.body, var)}
    if phase.combine == Combine.SUM:
        whole = Reduce(phase.body, tuple(f"r{k}" for k in range(len(phase.reduce))), phase.reduce, phase.combine,
                       phase.dtype)
        if axpy_sums(kernel, whole, var):
            return {"phase"}
    return set()


def _gemm(kernel: Kernel, phase: Phase, ext: np.ndarray, threads: int) -> Work:
    """Per k step the block stages A (ty*tm rows x bk, live rows evaluate factor a) and B (bk x tx*tn,
    live columns evaluate b) into shared memory; every thread runs its tm x tn micro-tile over the
    step; after the k loop each live element runs the epilogue and its stores."""
    g = phase.gemm
    r = ext.shape[1]
    m_n, n_n = np.prod(ext[:, r - 1 - g.rows:r - 1], axis=1).astype(float), ext[:, -1].astype(float)
    ntiles = len(ext)
    steps = -(-g.k // g.bk)
    pm, pn = g.ty * g.tm, g.tx * g.tn
    out = Work()
    # Factor a: k-invariant reductions (and, on the C target, k-invariant picks' pointers: Gemm.a_row_picks)
    # once per staged row (all pm rows) per k step, the rest per live element.
    def factor_a() -> tuple[Work, Work, bool]:
        a_pre, a_rest = _Counter(kernel), _Counter(kernel)
        memo: dict = {}
        hoisted = _invariant_reductions(g.a, set(g.vars))
        for node in hoisted:
            a_pre.value(node, 1.0, memo)
        picks = _invariant_picks(kernel, g.a, set(g.vars)) if g.a_row_picks else []
        for node in picks:
            a_pre.pick_pointer(node, 1.0, memo)
        a_rest.hoisted_picks = {_strip(n) for n in picks}
        a_rest.value(g.a, 1.0, dict(memo))
        a_rest.work.evals["  hoisted"] = float(bool(hoisted or picks))
        return a_pre.work, a_rest.work

    pre = _memo(kernel, g.a, ("a_pre", g.vars, g.a_row_picks), lambda: factor_a()[0])
    rest = _memo(kernel, g.a, ("a_rest", g.vars, g.a_row_picks), lambda: factor_a()[1])
    hoisted = rest.evals.get("  hoisted", 0.0) > 0
    out.add(pre, float(ntiles * steps * pm) if hoisted else 0.0)
    out.add(rest, float(m_n.sum()) * g.k)
    out.evals.pop("  hoisted", None)
    out.add(_memo(kernel, g.b, ("b",), lambda: _value_work(kernel, g.b)), float(n_n.sum()) * g.k)
    per_step = ntiles * steps
    item = g.stage_dtype.itemsize
    out.shared_store += per_step * (pm * g.bk + g.bk * pn) * item
    if g.mma:
        # Warps whose mma tiles hold a live row and column run every one of their tiles (zero-padded at
        # the edges) per k step: the A and B fragments of each k slice (4 + 2 elements per lane and mma
        # tile per 8 of k: TF32's k8, half of fp16's k16) from shared memory, then the mmas.
        fm, fn = g.mma_tiles
        warps = float((np.minimum(g.warps_m, np.ceil(m_n / (16 * fm)))
                       * np.minimum(g.warps_n, np.ceil(n_n / (8 * fn)))).sum())
        out.shared_load += steps * warps * 32 * (g.bk // 8) * (4 * fm + 2 * fn) * item
        mma = steps * warps * 32 * g.bk * 2 * g.tm * g.tn
        out.flops += mma
        out.mma_flops += mma
        if g.stage_dtype in (DType.F16, DType.BF16):
            out.mma_f16_flops += mma
    else:
        # Threads whose micro-tile holds a live row and column run the k loop; the others only stage.
        live = float((np.minimum(g.ty, np.ceil(m_n / max(1, g.tm))) * np.minimum(g.tx, np.ceil(n_n / max(1, g.tn)))).sum())
        out.shared_load += steps * live * g.bk * (g.tm + g.tn) * 4
        out.flops += steps * live * g.bk * 2 * g.tm * g.tn
        out.tiled_flops += steps * live * g.bk * 2 * g.tm * g.tn
    epi = _epilogue(kernel, phase)
    out.add(epi, float((m_n * n_n).sum()))
    out.nest = max(out.nest, g.k, epi.nest)
    return out


def _conv(kernel: Kernel, phase: Phase, ext: np.ndarray, threads: int, tiles: slice | None = None) -> Work:
    """Per channel step the block stages the input window (live rows x columns of live channels
    evaluate factor x) and its channels' weights (factor w), then every thread accumulates its tm
    channels x tn pixels over the step's channels and taps; the epilogue runs per live element."""
    c = phase.conv
    (sh, sw), (kh, kw), (dh, dw) = c.strides, c.taps, c.dilations
    c_n, oh_n, ow_n = (ext[:, 1].astype(float), ext[:, 2].astype(float), ext[:, 3].astype(float))
    wh_n = (oh_n - 1) * sh + (kh - 1) * dh + 1
    ww_n = (ow_n - 1) * sw + (kw - 1) * dw + 1
    ntiles = len(ext)
    dense = not c.depthwise
    step = c.bc if dense else 1
    total = c.channels if dense else 1
    steps = -(-total // step)
    out = Work()
    x = _memo(kernel, c.x, ("x",), lambda: _value_work(kernel, c.x))
    w = _memo(kernel, c.w, ("w",), lambda: _value_work(kernel, c.w))
    # Live staged entries summed over the steps: every channel of the reduction once (dense), or the
    # block's own channels (depthwise). Entries in the zero padding around the input load nothing.
    chans = np.full(ntiles, float(total)) if dense else c_n
    inside = _window_inside(kernel, phase, tiles, wh_n, ww_n)
    if inside is None:
        out.add(x, float((chans * wh_n * ww_n).sum()))
    else:
        pad = _memo(kernel, c.x, ("x_pad", c.window_vars),
                    lambda: _value_work(kernel, c.x, outside=frozenset(c.window_vars)))
        out.add(x, float((chans * inside).sum()))
        out.add(pad, float((chans * (wh_n * ww_n - inside)).sum()))
    out.add(w, float((c_n * (total if dense else 1) * kh * kw).sum()))
    per_step = ntiles * steps
    out.shared_store += per_step * (c.b_elems + c.a_elems) * 4
    # Threads with a live channel and a live pixel accumulate; the others only stage.
    thr = float((np.minimum(c.ty, np.ceil(c_n / max(1, c.tm))) * np.minimum(c.tx, oh_n * ow_n)).sum())
    inner = step * kh * kw
    if dense:
        out.shared_load += steps * thr * inner * (c.tm + c.tn) * 4
    else:
        out.shared_load += steps * thr * inner * (c.tm + c.tm * c.tn) * 4
    out.flops += steps * thr * inner * 2 * c.tm * c.tn
    out.tiled_flops += steps * thr * inner * 2 * c.tm * c.tn
    epi = _epilogue(kernel, phase)
    out.add(epi, float((c_n * oh_n * ow_n).sum()))
    out.nest = max(out.nest, total * kh * kw, epi.nest)
    return out


POSITIONS = 1 << 14  # output positions sampled per elementwise phase with guards (all of them up to 4x that)


def _positions(shape: tuple[int, ...], reduce: tuple[int, ...] = ()) -> dict[str, np.ndarray]:
    """Index variables i0.. over every position of `shape` (and r0.. over `reduce`), or a fixed sample
    of POSITIONS of them."""
    full = tuple(shape) + tuple(reduce)
    size = math.prod(full)
    if not full or not size:
        return {}
    if size <= 4 * POSITIONS:
        flat = np.arange(size, dtype=np.int64)
    else:
        flat = np.random.default_rng(0).integers(0, size, POSITIONS, dtype=np.int64)
    names = [f"i{d}" for d in range(len(shape))] + [f"r{d}" for d in range(len(reduce))]
    return dict(zip(names, np.unravel_index(flat, full)))


def _has_selects(body) -> bool:
    """Whether `body` holds a select (a pick chain's candidate; memoised on the body object)."""
    table = memo("count.selects", 20000)
    hit = table.get(id(body))
    if hit is None or hit[0] is not body:
        hit = table.put(id(body), (body, any(isinstance(n, E.Select) for n in kwalk(body))))
    return hit[1]


def _has_guards(body) -> bool:
    """Whether `body` holds a guard or a padded load (memoised on the body object)."""
    table = memo("count.guards", 20000)
    hit = table.get(id(body))
    if hit is None or hit[0] is not body:
        found = any(isinstance(n, Guard) or (isinstance(n, E.Load) and n.pad is not None) for n in kwalk(body))
        hit = table.put(id(body), (body, found))
    return hit[1]


def _value_work(kernel: Kernel, e, outside: frozenset[str] = frozenset()) -> Work:
    cnt = _Counter(kernel)
    cnt.outside = outside
    cnt.value(e, 1.0, {})
    return cnt.work


def _window_inside(kernel: Kernel, phase: Phase, tiles: slice | None, wh_n: np.ndarray,
                   ww_n: np.ndarray) -> np.ndarray | None:
    """Per tile, the staged input-window positions (rows x columns) inside the input: where the conv's
    padded loads and pad guards load. None where the factor has none, or where they do not all share
    one bounds condition on the window (then outside the common interior some would still load, and
    every position is counted as loading)."""
    from engine.codegen.conv import window_interior

    c = phase.conv
    conditions = set()
    for n in kwalk(c.x):
        if isinstance(n, E.Load) and n.pad is not None:
            index, shape = n.index, kernel.buffer(n.tensor).shape
        elif isinstance(n, InBounds):
            index, shape = n.index, n.shape
        else:
            continue
        conditions.add(frozenset((a.name, k, ix.const, shape[d]) for d, ix in enumerate(index)
                                 for a, k in ix.terms if isinstance(a, I.Var) and a.name in c.window_vars))
    if len(conditions) != 1 or not next(iter(conditions)):
        return None
    full = {v: (0, s * (size - 1) + d * (k - 1))
            for v, size, s, k, d in zip(c.window_vars, phase.region.shape[2:], c.strides, c.taps, c.dilations)}
    interior = window_interior(c, full, lambda t: kernel.buffer(t).shape)
    if interior is None:
        return None
    lo = region_bounds_of(phase.region, tiles)[0]
    (lo_h, hi_h), (lo_w, hi_w) = interior
    h0, w0 = lo[:, 2] * c.strides[0], lo[:, 3] * c.strides[1]
    rows = np.clip(np.minimum(hi_h, h0 + wh_n - 1) - np.maximum(lo_h, h0) + 1, 0, None)
    cols = np.clip(np.minimum(hi_w, w0 + ww_n - 1) - np.maximum(lo_w, w0) + 1, 0, None)
    return rows * cols


def _epilogue(kernel: Kernel, phase: Phase) -> Work:
    """One element of a tiled phase after its k loop: the body with the contraction replaced by the
    accumulator (or the accumulator itself), and the stores."""
    t = phase.gemm or phase.conv

    def compute() -> Work:
        cnt = _Counter(kernel)
        if t.target is not None:
            target = _strip(t.target)
            cnt.value(phase.body, 1.0, {target: True})
            # The contraction inlined into the phase is the accumulator: computed once per element.
            for n in _marked(phase.body, {target}):
                if isinstance(n, Inlined):
                    cnt.work.evals[n.stage] = cnt.work.evals.get(n.stage, 0.0) + 1.0
        cnt.stores(phase)
        cnt.work.evals[phase.stage] = cnt.work.evals.get(phase.stage, 0.0) + 1.0
        return cnt.work

    return _memo(kernel, phase.body, ("epilogue", phase.stage, phase.stores, t.target is None, phase.owned is None),
                 compute)


# ---- one element ----------------------------------------------------------------------------


def _strip(e):
    """kexpr.strip, memoised across calls (the counter strips every node it meets; the session's
    "count.strip" table, keyed on node identity with the node kept beside its entry)."""
    return strip(e, memo("count.strip", 200000).raw())


def _invariants(stripped, names) -> frozenset:
    """printer.invariant_values of a stripped body over loop variables `names`, memoised on the body's identity
    (kept beside its entry, as "count.strip" keeps its nodes): the tile search counts one phase body under many
    tiles, and a reduction's body is walked anew each time (zoo decoder_kv on host: 1,874 walks of 204 bodies,
    13 % of its cold planning)."""
    from engine.codegen.printer import invariant_values

    key = (id(stripped), frozenset(names))
    table = memo("count.invariants", 20000)
    hit = table.get(key)
    if hit is None or hit[0] is not stripped:
        hit = table.put(key, (stripped, frozenset(invariant_values(stripped, set(names)))))
    return hit[1]


def _invariant_picks(kernel: Kernel, body, loop_vars: set[str]) -> list:
    """The marked nodes of `body` whose unmarked form is a k-invariant pick (printer.invariant_picks)."""
    from engine.codegen.printer import invariant_picks

    return _marked(body, set(invariant_picks(kernel, _strip(body), loop_vars)))


def _invariant_reductions(body, loop_vars: set[str]) -> list:
    """Inlined reductions of `body` that do not depend on `loop_vars`, not under a pad guard: what
    the printer hoists per staged row (printer._invariant_reductions, on the marked body)."""
    from engine.codegen.printer import _invariant_reductions as hoistable

    found = hoistable(_strip(body), loop_vars)
    if not found:
        return []
    want = set(found)
    out, stack, seen = [], [body], set()
    while stack:
        n = stack.pop()
        if isinstance(n, Guard) or id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, (Reduce, Inlined)) and _strip(n) in want:
            out.append(n)
            want.discard(_strip(n))
            continue
        stack.extend(reversed(kchildren(n)))
    return out


# Distinct values one element's count may visit. The zoo's fused kernels need at most ~42,000 (mobilevit on
# a100, counted while planning); past the budget a candidate inlines reductions into reductions (lstm steps
# chained at REGISTER) and both counting it and running it would take too long.
VISIT_BUDGET = 100_000


class CountBudgetError(PlanError):
    """A segment whose inlined expressions are too deep to count (so also to run): refused as recompute."""


class _Counter:
    """Counts one element's SSA evaluation of expressions, as BodyWriter emits them: a memo (keyed
    on the printed, unmarked node) per scope; a reduction's invariant values hoisted into the scope
    around its loop; a guard's value in a scope of its own."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.work = Work()
        self.scopes: dict[str, bool] = {}
        self.visits = 0
        self.columnwise: set = set()  # sums the C target runs column-wise (_column_sums)
        self.in_loop = 0  # flops of the reduction loops being counted, nested ones taken out
        # Window variables of a conv's staged input at a position outside every padded load's tensor:
        # those loads take their pad value and those guards their pad (nothing loaded, nothing computed).
        self.outside: frozenset[str] = frozenset()
        # An elementwise phase's output positions (index variable -> values, all or a sample) and which of
        # them reach the value being counted: a guard's value, or a padded load, is counted at the share of
        # the positions that reach it where its condition holds (what the threads run), not at every one.
        self.positions: dict[str, np.ndarray] | None = None  # never empty
        self.reach: np.ndarray | None = None
        self.hoisted_picks: set = set()  # pick chains (unmarked) chosen outside this count's loop
        # A per-element phase's innermost loop (its variable, the typical tile's trip count) where the C target
        # computes the row's invariant values once before it (CPrinter.render_phase): a pick chain whose
        # conditions do not read that variable is chosen once per row (`_picked`).
        self.row: tuple[str, float] | None = None

    def _bytes(self, tensor: str, load: bool, times: float) -> None:
        buf = self.kernel.buffer(tensor)
        n = buf.dtype.itemsize * times
        if buf.scope == Scope.GLOBAL:
            if load:
                self.work.global_load += n
            else:
                self.work.global_store += n
        elif load:
            self.work.shared_load += n
        else:
            self.work.shared_store += n

    def stores(self, phase: Phase) -> None:
        """Per element: every store (global ones of a phase with an owned part are counted apart)."""
        for name in phase.stores:
            if phase.owned is None or self.kernel.buffer(name).scope != Scope.GLOBAL:
                self._bytes(name, False, 1.0)

    def index_loads(self, index, mult: float) -> None:
        for ix in index:
            for t in ix.indirect_tensors():
                self._bytes(t, True, mult)

    def value(self, e, mult: float, memo: dict) -> None:
        """Count `e` evaluated `mult` times per element (unless `memo` already holds it)."""
        if isinstance(e, E.Imm):
            return
        key = _strip(e)
        if key in memo:
            return
        memo[key] = True
        self.visits += 1
        if self.visits > VISIT_BUDGET:
            raise CountBudgetError(
                f"inlined expressions nest too deep to count (over {VISIT_BUDGET:,} distinct evaluations per "
                "element): an inlined reduction re-evaluates inlined reductions", hint="connect at SHARED")
        self.work.nest = max(self.work.nest, int(round(mult)))
        if isinstance(e, Inlined):
            self.work.evals[e.stage] = self.work.evals.get(e.stage, 0.0) + mult
            memo.pop(key)
            self.value(e.x, mult, memo)
            memo[key] = True
            return
        if isinstance(e, Guard):
            self.value(e.cond, mult, memo)
            if self._out_of_bounds(e.cond.index):
                return
            holds = self._holds(e.cond.index, e.cond.shape)
            if holds is None:
                self.value(e.x, mult, dict(memo))
                return
            outer = self.reach
            self.reach = holds if outer is None else outer & holds
            try:
                self.value(e.x, mult * self._share(self.reach, outer), dict(memo))
            finally:
                self.reach = outer
            return
        if isinstance(e, Reduce):
            self.reduction(e.body, e.vars, e.extents, mult, memo, columnwise=key in self.columnwise)
            return
        if isinstance(e, E.Load):
            if e.pad is None:
                self._bytes(e.tensor, True, mult)
            elif not self._out_of_bounds(e.index):
                holds = self._holds(e.index, self.kernel.buffer(e.tensor).shape)
                inside = mult if holds is None else mult * self._share(
                    holds if self.reach is None else self.reach & holds, self.reach)
                self._bytes(e.tensor, True, inside)
            self.index_loads(e.index, mult)
            return
        if isinstance(e, InBounds):
            self.index_loads(e.index, mult)
            return
        if isinstance(e, E.IndexVal):
            self.index_loads((e.expr,), mult)
            return
        if isinstance(e, E.Select) and self._picked(e, mult, memo):
            return
        if isinstance(e, (E.Unary, E.Binary)):
            self.work.flops += mult * E.op_flops(e)
            if e.op in E.OP_FLOPS and not E.small_pow(e):
                self.work.op_flops[e.op] = self.work.op_flops.get(e.op, 0.0) + mult * E.op_flops(e)
            if E.small_pow(e):
                self.value(e.a, mult, memo)
                return
        elif isinstance(e, E.Select):
            self.work.flops += mult
        for c in kchildren(e):
            self.value(c, mult, memo)

    def _holds(self, index, shape) -> np.ndarray | None:
        """Per sampled position, whether `index` lies inside `shape` (None: no positions, or the index
        needs a value the positions do not give, e.g. a reduction variable or a gathered one)."""
        if self.positions is None:
            return None
        out = None
        for ix, n in zip(index, shape):
            if ix.is_const:
                if not 0 <= ix.const < n:
                    return np.zeros(len(next(iter(self.positions.values()))), dtype=bool)
                continue
            v = I.evaluate(ix, self.positions)
            if v is None:
                return None
            ok = (v >= 0) & (v < n)
            out = ok if out is None else out & ok
        return out

    @staticmethod
    def _share(mask: np.ndarray | None, outer: np.ndarray | None) -> float:
        """Of the positions `outer` lets through (all when None), the share `mask` lets through."""
        if mask is None:
            return 1.0
        base = float(outer.sum()) if outer is not None else float(len(mask))
        return float(mask.sum()) / base if base else 0.0

    def _out_of_bounds(self, index) -> bool:
        return bool(self.outside) and any(isinstance(a, I.Var) and a.name in self.outside
                                          for ix in index for a, _ in ix.terms)

    def reduction(self, body, names, extents, mult: float, memo: dict, columnwise: bool = False) -> None:
        """A reduction loop: invariant values once in this scope, the rest once per term. Its flops
        (nested loops' taken out) go to `loop_flops` under its innermost trip count, unless the C target
        runs it column-wise."""
        stripped = _strip(body)
        hoist = _invariants(stripped, names)
        for node in _marked(body, hoist):
            self.value(node, mult, memo)
        inner = mult * math.prod(extents)
        self.work.nest = max(self.work.nest, int(round(inner)))
        before, nested = self.work.flops, self.in_loop
        self.in_loop = 0
        self.value(body, inner, dict(memo))
        self.work.flops += inner  # the combine
        own = self.work.flops - before - self.in_loop
        if extents and not columnwise:
            n = int(extents[-1])
            self.work.loop_flops[n] = self.work.loop_flops.get(n, 0.0) + own
        self.in_loop = nested + self.work.flops - before

    def _picked(self, e, mult: float, memo: dict) -> bool:
        """printer.pick_chain: a select chain over loads of one element of several tensors loads once,
        through a pointer the conditions choose."""
        from engine.codegen.printer import pick_chain

        picked = pick_chain(self.kernel, _strip(e))
        if picked is None:
            return False
        chain, last, _ = picked
        if _strip(e) not in self.hoisted_picks:  # else chosen once per staged row (`pick_pointer`)
            # Conditions on the row alone (lstm's stack of 32 step outputs: the step index) are printed before
            # the row's loop and GCC hoists the pointer choice after them: once per row, not per element.
            from engine.codegen.kexpr import free_vars

            per = mult
            if self.row is not None and not any(self.row[0] in free_vars(c) for c, _ in chain):
                per = mult / self.row[1]
            for cond, _ in chain:
                self.value(cond, per, memo)
                self.work.flops += per  # the pointer choice
        self._bytes(last.tensor, True, mult)
        return True

    def pick_pointer(self, e, mult: float, memo: dict) -> None:
        """The conditions and pointer choice of pick chain `e` (marked), without its load: what
        BodyWriter.pick_pointer emits where a GEMM's A staging hoists it (Gemm.a_row_picks)."""
        from engine.codegen.printer import pick_chain

        for cond, _ in pick_chain(self.kernel, _strip(e))[0]:
            self.value(cond, mult, memo)
            self.work.flops += mult


def _marked(body, targets: set) -> list:
    """The nodes of marked `body` whose unmarked form is in `targets` (outermost first)."""
    if not targets:
        return []
    out, seen, visited, stack = [], set(), set(), [body]
    while stack:
        n = stack.pop()
        if id(n) in visited:
            continue
        visited.add(id(n))
        s = _strip(n)
        if s in targets and s not in seen:
            seen.add(s)
            out.append(n)
            continue
        if isinstance(n, Guard) or isinstance(n, E.Imm):
            continue
        stack.extend(reversed(kchildren(n)))
    return out


def stage_factors(work: Work, sizes: Mapping[str, int]) -> dict[str, float]:
    """Per stage, evaluations over its size: how often each element is computed (1.0: once)."""
    return {s: work.evals[s] / sizes[s] for s in work.evals if sizes.get(s)}


__all__ = ["Work", "count_kernel", "count_program", "count_segment", "region_extents", "stage_factors"]
