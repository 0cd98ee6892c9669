"""Kernel IR: what `generate` produces from a Plan and what the CUDA and C printers render.

A Kernel is segments (separated by grid barriers), each a loop of blocks over tiles whose body is
phases (separated by block barriers); a phase computes one stage over its per-tile region. Values
that cross a barrier live in explicit buffers: BLOCK scope (shared memory / per-block array) or GLOBAL.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

from engine.ir.dtypes import DType
from engine.ir.expr import Expr
from engine.ir.graph import Combine


class Scope(StrEnum):
    GLOBAL = "global"  # device memory: a kernel parameter
    BLOCK = "block"  # one copy per block: __shared__ on CUDA, a per-block array on C


@dataclass(frozen=True)
class Span:
    """One dimension of a region as a function of the tile coordinates tc (the anchor's tiling):
    lo = base + sum(coeff * tc), hi = lo + ext, both clamped to [0, size] where `clamp` says so."""

    base: int
    ext: int
    coeffs: tuple[int, ...]
    clamp: bool = False


@dataclass(frozen=True)
class Region:
    """The box of a stage a block covers for tile t (tiles numbered row-major over `tiles`, the anchor's
    tile grid). Per dimension an affine `Span` of the tile coordinates, or, where the propagated boxes
    are not affine (clipped halos, wrapping reshapes), an explicit per-tile `table` of lo..., hi...."""

    shape: tuple[int, ...]  # the stage's full shape
    tiles: tuple[int, ...]  # tiles per anchor dimension
    spans: tuple[Span, ...] = ()
    table: tuple[tuple[int, ...], ...] = ()
    flat: int = 0  # >0: tile t covers flat elements [t*flat, (t+1)*flat) of the whole tensor

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def ntiles(self) -> int:
        n = 1
        for k in self.tiles:
            n *= k
        return n

    @cached_property
    def extent(self) -> tuple[int, ...]:
        """Largest box over all tiles: the capacity of a BLOCK buffer holding this region."""
        if self.spans:
            return tuple(min(s.ext, n) for s, n in zip(self.spans, self.shape))
        r = self.rank
        return tuple(max(row[r + d] - row[d] for row in self.table) for d in range(r))


@dataclass(frozen=True)
class Buffer:
    """A tensor as one kernel sees it. GLOBAL buffers are parameters; BLOCK buffers hold `region`."""

    name: str  # C identifier
    tensor: str  # graph tensor name
    dtype: DType
    shape: tuple[int, ...]  # the tensor's full shape (index space of loads)
    scope: Scope
    region: Region | None = None  # BLOCK only

    @property
    def capacity(self) -> int:
        n = 1
        for d in (self.region.extent if self.region else self.shape):
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.capacity * self.dtype.itemsize


@dataclass(frozen=True)
class Gemm:
    """A contraction run as a tiled GEMM over the last two axes of its phase's region (or, with `rows`
    > 1, over the last axis and the `rows` axes before it flattened row-major into the GEMM's rows, where
    factor b does not depend on them: a channels-last image's H x W pixels): per k step of
    `bk`, the block stages factor `a` (rows x k) and `b` (k x cols) into BLOCK buffers st_a/st_b, then
    each of the tx x ty threads accumulates a tm x tn register micro-tile; the epilogue (the phase body
    with `target` replaced by the accumulator, or the accumulator itself when `target` is None) runs
    per element after the k loop. Staging buffers are padded to ty*tm rows / tx*tn columns.

    The micro-kernel's parameters come from the device (engine/codegen/micro.py): tm x tn within its
    register budget, bk within its shared-memory budget; `vec_a` / `vec_b` elements per staging load of
    each factor (4: one float4 along a's k axis / b's column axis, where the factor is a plain global
    load, contiguous and 16-byte aligned there; 1: scalar), and `buffers` staging buffers (2: the next k
    tile is staged while the current one is consumed, one block barrier per k step). Printers without
    vector loads or double buffering (C, OpenCL) print the scalar single-buffered loop from the same IR."""

    a: Expr  # over the batch axes, the row axis and `vars`
    b: Expr  # over the batch axes, the column axis and `vars`
    target: object | None  # kexpr.Reduce inlined in the phase body, or None: the phase is the contraction
    vars: tuple[str, ...]
    extents: tuple[int, ...]
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    tx: int
    ty: int
    rows: int = 1  # region axes flattened into the GEMM's rows, ending at the second-to-last axis
    vec_a: int = 1
    vec_b: int = 1
    buffers: int = 1
    # Tensor cores (engine/codegen/mma.py): "" runs the FMA micro-tile above; "m16n8k8.tf32" runs each k
    # step as mma.sync m16n8k8 with TF32 operands, "m16n8k16.f16" as m16n8k16 with fp16 operands (staged
    # as fp16: `stage_dtype`), "m16n8k16.bf16" the same with bf16 operands, all with FP32 accumulators, on a warps_m x warps_n grid of warps, each
    # owning (ty*tm/16/warps_m) x (tx*tn/8/warps_n) mma tiles of the padded block tile. Printers without
    # tensor cores (C, OpenCL) print the FMA micro-tile from the same IR.
    mma: str = ""
    warps_m: int = 0
    warps_n: int = 0
    # C target (ctarget.block_gemms): the block-wide accumulator updated c_rows rows x c_cols columns at a
    # time (partial sums in vector registers), rows past the last whole group one at a time over c_wide
    # columns; `a_in` / `b_in`: (row or column stride, flat-k stride) of a factor read where it lies, ()
    # staged; `gemv` > 0: each output a dot product over the whole of k in `gemv` partial sums (B read in
    # place along k); `panel`: B's whole k range staged once per column tile in a per-thread panel;
    # `c_vector` > 0: a whole chunk wider than one vector of that many floats holds its partial sums in
    # named vector registers (arrays of several vectors GCC keeps on the stack), 0: in float arrays.
    c_rows: int = 0
    c_cols: int = 0
    c_wide: int = 0
    c_vector: int = 0
    a_in: tuple[int, ...] = ()
    b_in: tuple[int, ...] = ()
    gemv: int = 0
    panel: bool = False
    # `c_krun` > 0: with B read in place the micro-kernel keeps its sums in registers over this many k
    # (ctarget.k_run), a staged A staged as many columns at a time, instead of the IR's step bk
    c_krun: int = 0
    # staging loop orders (C): B staged with k innermost in bands of c_cols columns (B contiguous along k);
    # A staged with its rows innermost (A contiguous along its rows)
    b_k_inner: bool = False
    a_rows_inner: bool = False
    # C: factor a's picks whose conditions do not depend on k (printer.invariant_picks) choose their
    # tensor once per staged row, with its k-invariant reductions
    a_row_picks: bool = False

    @property
    def mma_tiles(self) -> tuple[int, int]:
        """m16n8 tiles per warp along the rows and the columns (mma path)."""
        return self.ty * self.tm // 16 // self.warps_m, self.tx * self.tn // 8 // self.warps_n

    @property
    def stage_dtype(self) -> DType:
        """Element type of the staging buffers: fp16 / bf16 on the m16n8k16 .f16 / .bf16 paths, else fp32."""
        return {"m16n8k16.f16": DType.F16, "m16n8k16.bf16": DType.BF16}.get(self.mma, DType.F32)

    @property
    def k(self) -> int:
        n = 1
        for e in self.extents:
            n *= e
        return n

    @property
    def a_elems(self) -> int:
        """Floats of one A staging buffer."""
        return self.ty * self.tm * self.bk

    @property
    def b_elems(self) -> int:
        """Floats of one B staging buffer."""
        return self.bk * self.tx * self.tn

    @property
    def params(self) -> dict:
        """The micro-kernel's parameters, as program.json records them."""
        return {"bm": self.bm, "bn": self.bn, "bk": self.bk, "tm": self.tm, "tn": self.tn, "tx": self.tx,
                "ty": self.ty, "vec_a": self.vec_a, "vec_b": self.vec_b, "buffers": self.buffers,
                **({"mma": self.mma, "warps_m": self.warps_m, "warps_n": self.warps_n} if self.mma else {}),
                **({"c_rows": self.c_rows, "c_cols": self.c_cols, "c_wide": self.c_wide, "a_in": list(self.a_in),
                    "b_in": list(self.b_in), "gemv": self.gemv, "panel": self.panel, "b_k_inner": self.b_k_inner,
                    "a_rows_inner": self.a_rows_inner, "a_row_picks": self.a_row_picks, "c_vector": self.c_vector,
                    "c_krun": self.c_krun}
                   if self.c_cols else {})}

    def describe_c(self) -> str:
        """The C target's blocking (ctarget.block_gemms), "" before it ran."""
        if not self.c_cols:
            return ""
        where = "".join(f", {n} in place" for n, s in (("a", self.a_in), ("b", self.b_in)) if s)
        where += ", a's picks chosen per row" if self.a_row_picks else ""
        if self.gemv:
            return f"; C: dot products over k in {self.gemv} partial sums{where}"
        panel = ", B panel per column tile" if self.panel else ""
        vectors = f" in {self.c_vector}-float vectors" if self.c_vector and self.c_cols > self.c_vector else ""
        run = f", k run {self.c_krun}" if self.c_krun else ""
        return f"; C: {self.c_rows}x{self.c_cols} register block{vectors} (tail rows {self.c_wide} wide){where}{panel}{run}"

    def describe(self) -> str:
        over = f" (rows over {self.rows} axes)" if self.rows > 1 else ""
        vec = "".join(f", {w}-wide loads of {n}" for n, w in (("a", self.vec_a), ("b", self.vec_b)) if w > 1)
        bufs = ", double-buffered" if self.buffers == 2 else ""
        if self.mma:
            fm, fn = self.mma_tiles
            return (f"tiled gemm {self.bm}x{self.bn}{over}, k {self.k} step {self.bk}, mma.sync {self.mma} "
                    f"({fm}x{fn} tiles per warp on {self.warps_m}x{self.warps_n} warps){vec}{bufs}")
        return (f"tiled gemm {self.bm}x{self.bn}{over}, k {self.k} step {self.bk}, "
                f"{self.tm}x{self.tn} per thread on {self.ty}x{self.tx} threads{vec}{bufs}")


@dataclass(frozen=True)
class Conv:
    """A contraction run as a direct convolution over a phase's region (batch axes one-wide, then the
    output channel axis, then two spatial axes): out[c, oh, ow] = sum over (ci, kh, kw) of
    x(ci, s*oh + d*kh, s*ow + d*kw) * w(c, ci, kh, kw). The block's tile is (channels x pixels); per
    step of `bc` input channels it stages the input window (with halo; the factor's own pad guards
    give the zero fill) and the weights of its channels into BLOCK buffers, then each of the tx x ty
    threads accumulates a tm (channels) x tn (pixels) register micro-tile. `depthwise`: the window is
    the block's own channels (no reduction over channels). The epilogue is the GEMM's."""

    x: Expr  # input factor over the batch axes, `chan_vars` (or the channel axis) and `window_vars`
    w: Expr  # weight factor over the channel axis, `chan_vars` and `tap_vars`
    target: object | None  # kexpr.Reduce inlined in the phase body, or None: the phase is the contraction
    chan_vars: tuple[str, ...]  # reduction over input channels (empty when depthwise)
    chan_extents: tuple[int, ...]
    tap_vars: tuple[str, str]  # reduction over kernel taps per spatial axis
    taps: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    window_vars: tuple[str, str]  # input position s*o + d*k per spatial axis (the loads' offsets kept)
    depthwise: bool
    out: tuple[int, int, int]  # region capacity: channels, output rows, output columns
    bc: int  # channels per staging step (dense) or channels staged (depthwise, ty*tm)
    tm: int
    tn: int
    tx: int
    ty: int
    # C target (conv.conv_dot_products): a conv over few pixels runs as dot products over (input channel,
    # tap), `dot_lanes` wide (0: the window form), `dot_channels` output channels x `dot_pixels` pixels of
    # partial-sum vectors in registers.
    dot_lanes: int = 0
    dot_channels: int = 0
    dot_pixels: int = 0
    # C target, the window form (ctarget.block_convs): `lanes`-float vector registers; output columns in
    # chunks of `chunk`; `chunk_channels` output channels x `chunk_rows` output rows per register block
    # (the channels left over one at a time over `lone_rows` rows); `by_channel`: output channels in the
    # vector lanes instead (ctarget.dense_by_channel: a pointwise conv over fewer pixels than a vector, or a
    # conv with taps or strides over tile rows narrower than a vector; depthwise_by_channel), where the
    # output channels fill whole vectors in groups of `channel_vectors` vectors, `channel_pixels` pixels of a row at a
    # time (ctarget.by_channel_blocking; 0: per pixel, the sums in an array).
    lanes: int = 0
    chunk: int = 0
    flat: bool = False  # the tile's rows run as one run of pixels (ctarget.flat_pixels; rows then 1)
    chunk_channels: int = 0
    chunk_rows: int = 0
    lone_rows: int = 0
    by_channel: bool = False
    channel_vectors: int = 0
    channel_pixels: int = 0
    # and the staging (ctarget.stage_convs): the input's window rows read in place (an unpadded plain load
    # whose last index is the window column), input channels per step, elements ahead to prefetch in-place
    # rows, the window staged channels innermost (a channels-last input), weights staged output channel
    # innermost (weights stored input-channel-major)
    x_in_place: bool = False
    step: int = 0
    prefetch: int = 0
    x_channels_last: bool = False
    w_channel_inner: bool = False
    # and how the window form prints (ctarget.conv_tails, split_chains, window_interiors): the widths of
    # whole-chunk tails after the chunk loop over an input read in place (narrowest last; the last few live
    # columns run at the narrowest width, or at `chunk` without tails); register blocks of fewer partial
    # sums than `two_chains_below` alternate tap rows between two chains of sums; the staged window's
    # positions (rows, columns: inclusive) where its loads need no bounds checks (None: all checked)
    tails: tuple[int, ...] = ()
    two_chains_below: int = 0
    interior: tuple[tuple[int, int], tuple[int, int]] | None = None

    buffers = 1  # the direct convolution stages one buffer per step (no double buffering yet)

    @property
    def channels(self) -> int:
        n = 1
        for e in self.chan_extents:
            n *= e
        return n

    @property
    def window(self) -> tuple[int, int]:
        """Rows and columns of the staged input window (capacity, halo included)."""
        return tuple((o - 1) * s + (k - 1) * d + 1
                     for o, s, k, d in zip(self.out[1:], self.strides, self.taps, self.dilations))

    @property
    def a_elems(self) -> int:  # staged weights
        per = self.taps[0] * self.taps[1]
        return self.ty * self.tm * per * (1 if self.depthwise else self.bc)

    @property
    def b_elems(self) -> int:  # staged input window
        return self.bc * self.window[0] * self.window[1]

    def describe(self) -> str:
        kind = "depthwise conv" if self.depthwise else f"direct conv, {self.channels} channels step {self.bc}"
        return (f"{kind} {self.taps[0]}x{self.taps[1]} stride {self.strides[0]}x{self.strides[1]}, "
                f"{self.out[0]} channels x {self.out[1]}x{self.out[2]} pixels, "
                f"{self.tm}x{self.tn} per thread on {self.ty}x{self.tx} threads"
                + (f", dot products {self.dot_lanes} lanes x {self.dot_channels} channels x {self.dot_pixels} pixels"
                   if self.dot_lanes else ""))

    def describe_c(self) -> str:
        """The C target's window-form blocking (ctarget.block_convs), "" before it ran or for dot products."""
        if not self.lanes:
            return ""
        if self.by_channel:
            blocks = (f", {self.channel_vectors} vectors x {self.channel_pixels} pixels per block"
                      if self.channel_vectors else "")
            return f"; C: {self.lanes}-lane vectors over output channels{blocks}"
        if self.flat:
            return (f"; C: {self.lanes}-lane vectors, the tile's rows as one run of pixels in {self.chunk}-pixel "
                    f"chunks, {self.chunk_channels} channels per block")
        return (f"; C: {self.lanes}-lane vectors, {self.chunk}-column chunks, {self.chunk_channels} channels x "
                f"{self.chunk_rows} rows per block ({self.lone_rows} rows for one channel)")

    @property
    def params(self) -> dict:
        """The blocking parameters, as program.json records them."""
        out = {"bc": self.bc, "tm": self.tm, "tn": self.tn, "tx": self.tx, "ty": self.ty}
        if self.dot_lanes:
            out |= {"dot_lanes": self.dot_lanes, "dot_channels": self.dot_channels, "dot_pixels": self.dot_pixels}
        if self.lanes:
            out |= {"lanes": self.lanes, "chunk": self.chunk, "flat": self.flat, "chunk_channels": self.chunk_channels,
                    "chunk_rows": self.chunk_rows, "lone_rows": self.lone_rows, "by_channel": self.by_channel,
                    "channel_vectors": self.channel_vectors, "channel_pixels": self.channel_pixels,
                    "x_in_place": self.x_in_place, "step": self.step, "prefetch": self.prefetch,
                    "x_channels_last": self.x_channels_last, "w_channel_inner": self.w_channel_inner,
                    "tails": list(self.tails), "two_chains_below": self.two_chains_below,
                    "interior": [list(r) for r in self.interior] if self.interior else None}
        return out


@dataclass(frozen=True)
class Phase:
    """Every thread of the block computes elements of `stage` over its region for the current tile:
    `value = combine over reduce of body` with loads resolved against the kernel's buffers (producers
    connected at REGISTER are already inlined into `body`). The value goes to each buffer in `stores`."""

    stage: str
    dtype: DType
    body: Expr
    region: Region
    stores: tuple[str, ...]  # buffer names
    reduce: tuple[int, ...] = ()
    combine: Combine | None = None
    threads_per_row: int = 1  # >1: threads of a row split the reduction and combine in a tree
    gemm: Gemm | None = None  # set: the contraction in this phase runs as a tiled GEMM
    conv: Conv | None = None  # set: the contraction in this phase runs as a direct convolution
    # C target (ctarget.cache_lines): subexpressions of the innermost variable alone this phase reads from
    # a segment's LineCache, as (value, array, lo), and those it computes once per tile into arrays line0...
    line_reads: tuple[tuple[object, str, int], ...] = ()
    tile_lines: tuple[object, ...] = ()
    # C target (ctarget.sum_columns): inlined sums (kexpr.Reduce) run column-wise before the innermost loop
    column_sums: tuple[object, ...] = ()
    # C target (ctarget.split_ranges): positions of the innermost output axis (absolute, 0 < t < its size)
    # where a condition of the body on that variable alone changes value; the innermost loop runs in the
    # pieces between them, each printed with those conditions folded
    splits: tuple[int, ...] = ()
    # Where tiles' regions overlap (a halo, rows every column tile needs), the elements this tile writes
    # to GLOBAL buffers: each element by one tile only (affine spans; a flat region only stands for the
    # count of a sampled segment). None: the whole region.
    owned: Region | None = None

    def describe(self) -> str:
        red = f" {self.combine.value} over {list(self.reduce)}" if self.combine else ""
        from engine.codegen.kexpr import kformat

        tiled = self.gemm or self.conv
        # (describe() alone titles the phase in the printed source; the C target's choices come after it)
        tiled = f" [{tiled.describe()}{tiled.describe_c()}]" if tiled else ""
        return f"{self.stage}{red} = {kformat(self.body)} -> {', '.join(self.stores)}{tiled}"


@dataclass(frozen=True)
class RowCache:
    """A reduction's per-term value that a later phase of the same tile recomputes: softmax's exp in
    the normalise phase (along its innermost axis), its masked logits in the sum phase (along the
    same r0). The reduction loop stores each term in a per-tile array `name[rows][n]` (L1-resident),
    the later phase reads it back: same value, so the same rounding. C target: ctarget.cache_rows."""

    name: str
    producer: str  # stage of the reduction phase
    consumer: str  # stage of the later phase (elementwise, or a reduction over the same rows)
    term: object  # the reduced term at the consumer's index (its innermost variable for r0)
    row_dims: int  # leading axes both phases share; the consumer's next axis runs along the row
    extents: tuple[int, ...]  # of the row axes
    n: int  # row length

    @property
    def size(self) -> int:
        return math.prod(self.extents) * self.n


@dataclass(frozen=True)
class LineCache:
    """C target (ctarget.cache_lines): `value`, an expensive subexpression of the one loop variable `var`
    (a broadcast chain exp(-sqrt(|a|^2.5 + 1)) along a row's columns), computed into the array `name`
    over var in lo..hi-1 once per launch, before the tile loop (every tile reads the same range), and
    read by the phases instead of recomputed per row."""

    name: str
    value: object  # kexpr over `var` alone
    var: str
    lo: int
    hi: int


@dataclass(frozen=True)
class Segment:
    """Blocks loop over the anchor's tiles; phases are separated by block barriers."""

    anchor: str
    ntiles: int
    phases: tuple[Phase, ...]
    # C target (ctarget.schedule_segments): how the OpenMP threads share the tiles — "serial" (the calling
    # thread: too little work to wake a team), "guided" or "static" (a weight-streaming GEMV); `work`, the
    # element-steps that decided it. "" before the pass ran.
    omp: str = ""
    work: int = 0
    # C target (ctarget.schedule_segments), for a "guided" or "static" segment: who runs the parallel tile
    # loop — "pool" (the C header's tw_parallel_for: the caller claims chunks too and waits only for chunks
    # a worker claimed) or "omp" (an OpenMP parallel for: every team thread must reach its end) — and the
    # pool's tiles per claim (guided: the least a claim takes; 0 with "static": one even share per thread).
    loops: str = ""
    chunk: int = 0
    panel_axis: int = -1  # C target: tiles walked column tile by column tile along this axis (Gemm.panel)
    row_caches: tuple[RowCache, ...] = ()  # C target: per-tile arrays of reduction terms a later phase rereads
    launch_lines: tuple[LineCache, ...] = ()  # C target: arrays computed once per launch (before the tile loop)



def _reads(e, names) -> set[str]:
    """Names among `names` that loads in the kernel expression `e` read."""
    from engine.codegen.kexpr import loaded

    return loaded(e) & names if e is not None else set()


def phase_reads(phase: Phase, seg: Segment, names) -> set[str]:
    """Buffers among `names` the phase reads: its body, its tiled GEMM's / convolution's factors and
    epilogue, the C target's cached lines and column sums, and the terms of the segment's row caches it
    rereads (every place a printer or the emulator loads a buffer from)."""
    exprs = [phase.body, *phase.tile_lines, *phase.column_sums, *(v for v, _, _ in phase.line_reads)]
    if phase.gemm is not None:
        exprs += [phase.gemm.a, phase.gemm.b, phase.gemm.target]
    if phase.conv is not None:
        exprs += [phase.conv.x, phase.conv.w, phase.conv.target]
    exprs += [c.term for c in seg.row_caches if phase.stage in (c.producer, c.consumer)]
    out: set[str] = set()
    for e in exprs:
        out |= _reads(e, names)
    return out


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[Buffer, ...]  # GLOBAL buffers in argument order
    locals: tuple[Buffer, ...]  # BLOCK buffers
    segments: tuple[Segment, ...]  # separated by grid barriers
    threads: int
    stages: tuple[str, ...]
    origin: tuple[str, ...]  # ONNX nodes
    c_lanes: int = 0  # >0: the C target's passes (ctarget.c_decisions) chose its parameters for these vector lanes

    @property
    def cooperative(self) -> bool:
        return len(self.segments) > 1

    @cached_property
    def buffer_lives(self) -> tuple[tuple[int, int], ...]:
        """Per BLOCK buffer (in `locals` order), the phases it lives over, (first, last) as indices into
        the kernel's phases counted across its segments: from the first phase that stores or reads it to
        the last. Phases are separated by block barriers (and segments by grid barriers), so a buffer is
        dead outside its life and another may take its bytes. A buffer lives in the segment that stores
        it (values that cross a grid barrier go through global memory); it lives over its whole segment
        where it is read before its first store in phase order (a value carried from the block's previous
        tile) or where no other buffer of the segment could share its bytes, and over the whole kernel
        when nothing stores it."""
        names = {b.name for b in self.locals}
        owner: dict[str, int] = {}
        spans, k = [], 0
        for s, seg in enumerate(self.segments):
            spans.append((k, k + len(seg.phases) - 1))
            k += len(seg.phases)
            for p in seg.phases:
                for n in p.stores:
                    if n in names:
                        owner.setdefault(n, s)
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        stored: dict[str, int] = {}
        for s, seg in enumerate(self.segments):
            mine = {n for n, o in owner.items() if o == s}
            if len(mine) < 2:  # (the common case, and the walk over the phases' expressions is not free)
                continue
            at = spans[s][0]
            carried = {n for c in seg.launch_lines for n in _reads(c.value, mine)}
            for j, p in enumerate(seg.phases):
                for n in (set(p.stores) & mine) | phase_reads(p, seg, mine):
                    first.setdefault(n, at + j)
                    last[n] = at + j
                for n in set(p.stores) & mine:
                    stored.setdefault(n, at + j)
            for n in carried:
                first[n], last[n] = spans[s]
        out = []
        for b in self.locals:
            if b.name not in owner:
                out.append((0, max(0, k - 1)))
            elif b.name not in first or stored[b.name] > first[b.name]:
                out.append(spans[owner[b.name]])
            else:
                out.append((first[b.name], last[b.name]))
        return tuple(out)

    @cached_property
    def _layout(self) -> tuple[tuple[int, ...], int]:
        """Offsets of the BLOCK buffers (16 B aligned) and the bytes they take: buffers whose lives
        (`buffer_lives`) are disjoint share bytes. First fit, largest buffer first (ties in phase order,
        then declaration order): each buffer at the lowest aligned offset clear of every buffer placed
        before it whose life overlaps its own. Values that cross a grid barrier go through global memory,
        so buffers of different segments never overlap in life; a buffer's offset is at most the bytes of
        its own segment's buffers placed before it, so no segment takes more than the sum of its buffers.
        The C target declares each block buffer an array of its own (per tile, on the stack) and does not
        read this layout: pointers into one per-block byte array measured lstm's host program 7 % slower
        (benchmarks/NOTES.md, smem)."""
        lives = self.buffer_lives
        sizes = [-(-b.nbytes // 16) * 16 for b in self.locals]
        order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], lives[i][0], i))
        offsets = [0] * len(sizes)
        placed: list[int] = []
        for i in order:
            lo, hi = lives[i]
            busy = sorted((offsets[j], offsets[j] + sizes[j]) for j in placed
                          if lives[j][0] <= hi and lo <= lives[j][1])
            at = 0
            for a, b in busy:
                if at + sizes[i] <= a:
                    break
                at = max(at, b)
            offsets[i] = at
            placed.append(i)
        return tuple(offsets), max((o + n for o, n in zip(offsets, sizes)), default=0)

    @property
    def shared_offsets(self) -> tuple[int, ...]:
        """Byte offset of each BLOCK buffer in the block's shared memory (16 B aligned; buffers whose
        lives are disjoint overlap)."""
        return self._layout[0]

    @property
    def gemms(self) -> tuple[Gemm, ...]:
        return tuple(p.gemm for s in self.segments for p in s.phases if p.gemm is not None)

    @property
    def convs(self) -> tuple[Conv, ...]:
        return tuple(p.conv for s in self.segments for p in s.phases if p.conv is not None)

    @property
    def staging_bytes(self) -> tuple[int, int]:
        """Bytes of the GEMM/conv staging buffers st_a, st_b (shared by the kernel's tiled phases, each
        in its own element type: Gemm.stage_dtype, fp32 for convs; a double-buffered GEMM's two buffers
        one after the other), placed in shared memory after the BLOCK buffers."""
        tiled = self.gemms + self.convs
        item = [g.stage_dtype.itemsize if isinstance(g, Gemm) else 4 for g in tiled]
        return (max((g.a_elems * g.buffers * n for g, n in zip(tiled, item)), default=0),
                max((g.b_elems * g.buffers * n for g, n in zip(tiled, item)), default=0))

    @property
    def staging(self) -> tuple[int, int]:
        """Floats of the staging buffers st_a, st_b (`staging_bytes` in whole floats)."""
        a, b = self.staging_bytes
        return -(-a // 4), -(-b // 4)

    @property
    def staging_dtypes(self) -> frozenset[DType]:
        """Element types the kernel's tiled phases stage in (the printer declares a view of st_a / st_b
        per type)."""
        return frozenset(g.stage_dtype if isinstance(g, Gemm) else DType.F32 for g in self.gemms + self.convs)

    @property
    def locals_bytes(self) -> int:
        return self._layout[1]

    @property
    def reduce_scratch_bytes(self) -> int:
        """Shared memory for cross-warp reduction partials (one 8-byte slot per warp) when a reduction
        phase spreads a row over more than a warp's lanes."""
        wide = any(p.threads_per_row > 32 for s in self.segments for p in s.phases)
        return -(-8 * (-(-self.threads // 32)) // 16) * 16 if wide else 0

    @property
    def shared_bytes(self) -> int:
        a, b = self.staging_bytes
        return self.locals_bytes + -(-a // 16) * 16 + -(-b // 16) * 16 + self.reduce_scratch_bytes

    @property
    def ntiles(self) -> int:
        return max(s.ntiles for s in self.segments)

    def buffer(self, name: str) -> Buffer:
        for b in self.params + self.locals:
            if b.name == name:
                return b
        raise KeyError(name)

    def stripped(self) -> Kernel:
        """This kernel without the Inlined provenance markers in its bodies: what printers render."""
        from engine.codegen.kexpr import strip

        memo: dict = {}

        def tiled(t):
            if t is None:
                return None
            fields = {"target": strip(t.target, memo) if t.target is not None else None}
            if isinstance(t, Gemm):
                fields.update(a=strip(t.a, memo), b=strip(t.b, memo))
            else:
                fields.update(x=strip(t.x, memo), w=strip(t.w, memo))
            return dataclasses.replace(t, **fields)

        segments = tuple(dataclasses.replace(s, phases=tuple(
            dataclasses.replace(p, body=strip(p.body, memo), gemm=tiled(p.gemm), conv=tiled(p.conv))
            for p in s.phases)) for s in self.segments)
        return dataclasses.replace(self, segments=segments)


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: int
    block: int
    shared_bytes: int
    cooperative: bool
    args: tuple[str, ...]  # tensor names, in parameter order


@dataclass(frozen=True)
class Allocation:
    tensor: str
    offset: int
    nbytes: int
    first: int  # index of the first launch touching it
    last: int  # index of the last launch touching it


@dataclass(frozen=True)
class MemoryPlan:
    """Intermediate tensors placed in one arena by liveness over the launch order."""

    allocations: tuple[Allocation, ...]
    arena_bytes: int  # peak
    naive_bytes: int  # one buffer per tensor

    def offset(self, tensor: str) -> int:
        for a in self.allocations:
            if a.tensor == tensor:
                return a.offset
        raise KeyError(tensor)


@dataclass(frozen=True)
class Program:
    name: str
    model_hash: str
    plan_hash: str
    policy: str
    device: str
    kernels: tuple[Kernel, ...]
    launches: tuple[Launch, ...]
    memory: MemoryPlan
    inputs: tuple[str, ...]
    constants: tuple[str, ...]
    outputs: tuple[str, ...]
    output_names: tuple[str, ...]

    def kernel(self, name: str) -> Kernel:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)

    @property
    def launch_tensors(self) -> tuple[str, ...]:
        """Every tensor a launch passes, once each, in order of first use: the pointer array the C
        target's program entry (`PROGRAM_ENTRY`) takes, entry i pointing at tensor i."""
        return tuple(dict.fromkeys(t for launch in self.launches for t in launch.args))


PROGRAM_ENTRY = "tw_program"  # the C target's one call that runs every launch in order
ENTRY_COMMENT = "// the program entry: every launch in order, tw_b[i] -> launch tensor i"  # the line before it


def program_to_json(program: Program) -> dict:
    """program.json: launch list, grids, blocks, shared bytes, buffers (a block buffer's byte offset and the
    phases it lives over: Kernel.shared_offsets, Kernel.buffer_lives), and each kernel's phases."""
    from engine.codegen.kexpr import kformat

    kernels = []
    for k in program.kernels:
        kernels.append({
            "name": k.name, "threads": k.threads, "cooperative": k.cooperative, "shared_bytes": k.shared_bytes,
            "stages": list(k.stages), "origin": list(k.origin),
            "params": [{"name": b.name, "tensor": b.tensor, "dtype": b.dtype.value, "shape": list(b.shape)}
                       for b in k.params],
            "locals": [{"name": b.name, "tensor": b.tensor, "dtype": b.dtype.value,
                        "extent": list(b.region.extent) if b.region else [], "offset": off, "live": list(live)}
                       for b, off, live in zip(k.locals, k.shared_offsets, k.buffer_lives)],
            "segments": [{"anchor": s.anchor, "ntiles": s.ntiles, "phases": [p.describe() for p in s.phases],
                          **({"omp": s.omp, "work": s.work} if s.omp else {}),
                          **({"loops": s.loops, "chunk": s.chunk} if s.loops else {}),
                          **({"panel_axis": s.panel_axis} if s.panel_axis >= 0 else {}),
                          **({"row_caches": [f"{c.name}: {c.producer} terms reread by {c.consumer}, {c.size} floats"
                                             for c in s.row_caches]} if s.row_caches else {}),
                          **({"launch_lines": [f"{c.name}: {kformat(c.value)} over {c.var} {c.lo}..{c.hi - 1}"
                                               for c in s.launch_lines]} if s.launch_lines else {}),
                          **({"tile_lines": {p.stage: [kformat(v) for v in p.tile_lines] for p in s.phases
                                             if p.tile_lines}} if any(p.tile_lines for p in s.phases) else {}),
                          **({"splits": {p.stage: list(p.splits) for p in s.phases if p.splits}}
                             if any(p.splits for p in s.phases) else {})}
                         for s in k.segments],
            "gemms": [{"stage": p.stage, **p.gemm.params} for s in k.segments for p in s.phases if p.gemm],
        })
        if k.c_lanes:  # the C target's choices (absent from a CUDA program)
            kernels[-1] |= {"c_lanes": k.c_lanes,
                            "convs": [{"stage": p.stage, **p.conv.params} for s in k.segments for p in s.phases
                                      if p.conv]}
    return {
        "name": program.name, "model_hash": program.model_hash, "plan_hash": program.plan_hash,
        "policy": program.policy, "device": program.device, "kernels": kernels,
        "launches": [{"kernel": ln.kernel, "grid": ln.grid, "block": ln.block, "shared_bytes": ln.shared_bytes,
                      "cooperative": ln.cooperative, "args": list(ln.args)} for ln in program.launches],
        "memory": {"arena_bytes": program.memory.arena_bytes, "naive_bytes": program.memory.naive_bytes,
                   "allocations": [vars(a) for a in program.memory.allocations]},
        "inputs": list(program.inputs), "constants": list(program.constants), "outputs": list(program.outputs),
        "output_names": list(program.output_names),
    }
