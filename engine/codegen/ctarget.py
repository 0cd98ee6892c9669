"""The C target's passes: a Kernel and the vector lanes of the CPU it runs on in, the same Kernel with the
C printer's choices recorded out — direct-conv register blocking (Conv.lanes/chunk/...), the GEMM
micro-kernel and its operands read in place, GEMV mode and B panels (Gemm.c_rows/.../panel), how the
threads share each segment's tiles (Segment.omp; .loops: the C header's pool or OpenMP; .chunk), row and
line caches, reciprocals of row values and column-wise sums. `c_decisions` runs them; the C printer renders the fields. Each pass is a pure function
of the IR (and the lanes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from engine.codegen.conv import flat_stride, window_interior
from engine.codegen.kexpr import Guard, Reduce, free_vars, kchildren, kmap, kwalk, substitute_body
from engine.codegen.kir import Kernel, LineCache, Phase, Program, RowCache, Segment
from engine.codegen.micro import C_STAGE_BYTES
from engine.device import Device
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.expr import LIBM_CALLS
from engine.ir.graph import Combine

# ---- OpenMP: which segments get a team ------------------------------------------------------------

# Element-steps below which a C segment runs serially. On an idle machine (2 threads, vectorised
# a*x+b) an OpenMP parallel loop costs ~3 us over the serial one and breaks even near 64 K
# element-steps; but on a shared machine every parallel loop may wait a whole time slice (~8 ms) for
# a descheduled thread at its end: at 64 K, lstm's 30 per-step segments went parallel and its median
# run took 264 ms instead of 20 ms. So only segments well past break-even get a team.
SERIAL_WORK = 1 << 19
STREAM_WORK = 1 << 17  # element-steps from which a weight-streaming GEMV segment splits statically
# Element-steps one claim of the C thread pool (tw_parallel_for) takes at least: a claim is one atomic
# compare-and-swap on a line every thread writes (~0.1 us contended), so per tile it would cost what the old
# schedule(dynamic) did (512 LayerNorm row tiles ~1.5x slower than guided); 16 K element-steps is a few
# microseconds of work, against which a claim is noise.
CLAIM_WORK = 1 << 14
TRANSCENDENTAL_STEPS = 8  # element-steps one exp/tanh/erf/log/pow/sqrt/... counts for
_EXPENSIVE = {"exp", "log", "tanh", "erf", "sigmoid", "sqrt", "rsqrt", "sin", "cos", *LIBM_CALLS}

# ---- the GEMM micro-kernel -------------------------------------------------------------------------

# GEMM_ROWS x GEMM_COLS partial sums in registers (four AVX-512 vectors, eight AVX2 ones). Measured on
# the host (Zen 4, one thread, bert's 128x768x768 GEMM, 64x64 blocks, k step 32): 4x16 1.70 ms, 8x16
# 1.80, 16x16 2.0, 4x32 3.1, 4x64 2.4, 8x32 2.5; the rank-1 updates of the whole block through memory
# 3.5; AVX2 only (target no-avx512f) 4x16 3.9. Wider chunks than one vector per row lose as float arrays:
# GCC no longer keeps every partial sum in a register. So where a chunk spans several vectors (AVX2: 16
# columns are two) its sums are named vector registers (Gemm.c_vector): on Zen 3 (AVX2, one thread, a
# 128x128 block, k 256 step 32) 4x16 as arrays 35 GFLOP/s (sums on the stack), as named vectors 57
# (B pinned in registers, targets.C0_PINn; 48-52 with B re-read per row), of a 95 GFLOP/s FMA peak
# (benchmarks/NOTES.md "avx2gemm").
GEMM_ROWS = 4
GEMM_COLS = 16
# Tiles of at most GEMV_ROWS rows with B contiguous along k run as dot products of GEMV_LANES
# partial sums (several independent vector accumulators, so the FMA latency overlaps); so do tiles of at
# most GEMV_COLS columns with A read in place along k too (the micro-kernel would pad them to GEMM_COLS:
# nerf's one-column head did 16x its multiply-adds, 207 us against 47 modeled; benchmarks/NOTES.md
# "skinnygemm").
GEMV_ROWS = 4
GEMV_COLS = 4
GEMV_LANES = 32
PANEL_BYTES = 4 << 20  # largest per-thread B panel a C GEMM keeps across tiles
PREFETCH_CHANNELS = 4  # input channels ahead a direct conv prefetches rows read in place
MAX_LINE = 16384  # floats of one per-tile line cache or dot-product row (on the stack of an OpenMP thread)
ROW_CACHE_FLOATS = 4 * MAX_LINE  # floats of all of a tile's row caches
# L1 data cache geometry (32 KiB, 8 ways, 64-byte lines: one way spans 4 KiB) and the most lines of
# one k step of B that may share a set while the micro-kernel's row groups reread them.
L1_WAY_BYTES = 4096
B_LINES_PER_SET = 4


def c_lanes(device: Device) -> int:
    """fp32 lanes of the vector registers the C kernels are built for: the host's measured figure for a
    CPU device; for a GPU's plan run on this CPU, what the C compiler targets here (-march=native: its
    predefined macros, the host probe's rule)."""
    if device.kind == "cpu" and device.vector_lanes > 1:
        return device.vector_lanes
    from engine.codegen.ccompile import compiler_lanes

    return compiler_lanes()


def c_decisions(kernel: Kernel, lanes: int) -> Kernel:
    """The C printer's choices for `kernel` on a CPU with `lanes`-float vectors, recorded in its IR:
    `block_convs`, `split_chains`, `window_interiors`, `block_gemms`, `schedule_segments`, `cache_rows`,
    then `reciprocal_rows` (the row caches hold the terms as the bodies read before it), `cache_lines`
    and `sum_columns` (on the bodies after it), and last `split_ranges` (on the bodies as printed). Run
    after conv.conv_dot_products, whose convs keep their dot-product form."""
    kernel = window_interiors(split_chains(block_convs(kernel, lanes)))
    kernel = cache_rows(schedule_segments(block_gemms(kernel, lanes)))
    return dataclasses.replace(split_ranges(sum_columns(cache_lines(reciprocal_rows(kernel)))), c_lanes=lanes)


def for_c(program: Program) -> Program:
    """`program` with `c_decisions` taken for every kernel that has not had them (a CUDA program
    printed as C: the golden sources, the DUMP_DIR trail), for this CPU's compiler's lanes."""
    if all(k.c_lanes for k in program.kernels):
        return program
    from engine.codegen.ccompile import compiler_lanes

    lanes = compiler_lanes()
    return dataclasses.replace(program, kernels=tuple(k if k.c_lanes else c_decisions(k, lanes)
                                                      for k in program.kernels))


def _map_phases(kernel: Kernel, fn: Callable[[Kernel, Phase], dict | None]) -> Kernel:
    """`kernel` with the fields fn(stripped kernel, stripped phase) returns set on each phase's gemm or
    conv (None: unchanged): decisions are taken on what the printer renders (no Inlined markers); the
    markers stay in the kernel."""
    bare = kernel.stripped()
    segments = []
    for seg, bseg in zip(kernel.segments, bare.segments):
        phases = []
        for p, bp in zip(seg.phases, bseg.phases):
            fields = fn(bare, bp)
            if fields is not None:
                p = (dataclasses.replace(p, gemm=dataclasses.replace(p.gemm, **fields)) if p.gemm is not None
                     else dataclasses.replace(p, conv=dataclasses.replace(p.conv, **fields)))
            phases.append(p)
        segments.append(dataclasses.replace(seg, phases=tuple(phases)))
    return dataclasses.replace(kernel, segments=tuple(segments))


# ---- direct convolutions ----------------------------------------------------------------------------


def block_convs(kernel: Kernel, lanes: int) -> Kernel:
    """Each window-form convolution's register blocking for `lanes`-float vectors: output columns per
    chunk (`conv_chunk`), output channels (`conv_channels`) and rows (`conv_rows`) per block of partial
    sums, or output channels in the lanes (`by_channel`), and the tails after the chunks of a window
    read in place (`conv_tails`); convs marked for dot products keep theirs."""
    def block(bare: Kernel, p: Phase) -> dict | None:
        c = p.conv
        if c is None or c.dot_lanes:
            return None
        co, oh, ow = c.out
        by_channel = dense_by_channel(c, lanes) or depthwise_by_channel(c, lanes)
        blocking = depthwise_blocking if c.depthwise else by_channel_blocking
        groups, pixels = blocking(co // lanes, ow, lanes) if by_channel and co % lanes == 0 else (0, 0)
        # A depthwise conv by channel stages its window channels-last (never read in place).
        in_place = _window_rows_in_place(c) and not (c.depthwise and by_channel)
        flat = not by_channel and in_place and flat_pixels(bare, p)
        run = oh * ow if flat else ow  # output columns one register-blocked row runs along
        v = conv_chunk(run, lanes)
        nc = 1 if c.depthwise else conv_channels(v, co, lanes)
        taps = c.taps[0] * c.taps[1]
        step = 1 if c.depthwise else c.bc
        if in_place and not c.depthwise and co * c.channels * taps <= MAX_LINE:
            step = c.channels  # nothing staged but weights: one step, partial sums stay in registers
        # A window row read in place sits a whole channel plane from the next channel's: too far for
        # the hardware's stride prefetchers, so each (channel, row) load would miss to L2/L3.
        chan = flat_stride(bare, c.x, c.chan_vars[-1]) if in_place and c.chan_vars else None
        one_chan = len(c.chan_vars) == 1
        tails = conv_tails(v, lanes) if in_place else ()
        if flat:  # whole vectors down to one, then the last few pixels (fewer than a vector) as one (c0_loadnN)
            tails = tuple(t for t in tails if t % lanes == 0) + ((lanes,) if v > lanes and lanes not in tails else ())
        return {"lanes": lanes, "chunk": v, "tails": tails,
                "chunk_channels": nc, "chunk_rows": 1 if flat else conv_rows(v, oh, nc, lanes),
                "lone_rows": 1 if flat else conv_rows(v, oh, 1, lanes), "by_channel": by_channel, "flat": flat,
                "channel_vectors": groups, "channel_pixels": pixels, "x_in_place": in_place,
                "step": step, "prefetch": PREFETCH_CHANNELS * chan if chan and chan * 4 > 1024 else 0,
                "x_channels_last": one_chan and contiguous_along(bare, c.x, c.chan_vars[0], c.window_vars[1]),
                "w_channel_inner": one_chan and contiguous_along(bare, c.w, "i1", c.chan_vars[0])}

    return _map_phases(kernel, block) if kernel.convs else kernel


def flat_pixels(kernel: Kernel, p: Phase) -> bool:
    """Whether a pointwise stride-1 conv whose input rows are read in place runs its tile's pixels as one
    run (Conv.flat): every tile spans whole output rows (the width axis one tile, unclamped, from 0) and
    the input is indexed by the output row and column alone in a tensor of the same width, so the tile's
    rows follow one another in memory in the input and in the accumulator alike. Row by row a 7- or 14-wide
    row runs one short lane loop with its sums in memory: resnet50's 1x1 convs over 7x7 and 14x14 maps
    measured 2-4x their model (benchmarks/NOTES.md flatpixels)."""
    c = p.conv
    if c.depthwise or c.taps != (1, 1) or c.strides != (1, 1) or not p.region.spans or p.region.rank != 4:
        return False
    width = p.region.shape[3]
    span = p.region.spans[3]
    if span.base != 0 or span.ext != width or any(span.coeffs):
        return False
    (h, w), x = c.window_vars, c.x
    if len(x.index) < 2 or x.index[-2] != I.Lin(((I.Var(h), 1),)) or x.index[-1] != I.Lin(((I.Var(w), 1),)):
        return False
    return kernel.buffer(x.tensor).shape[-1] == width


def dense_by_channel(c, lanes: int) -> bool:
    """Whether a window-form dense conv runs with its output channels in the vector lanes: a pointwise one
    over fewer pixels than a vector (convnext's last stage, 2x2), or one with taps or strides whose tile
    rows are narrower than a vector, whose tile channels fill whole vectors and which is one of:
    - read in place: the window form ran its narrow lane loop, the sums in memory (a 1x1 stride-2 conv
      over 8x8: 10.9 us, 3.4 by channel; a 2x2 stride-2 one 42-85, 10-21);
    - staged over at least two vectors' worth of pixels with at least BY_CHANNEL_TERMS (input channel,
      tap) terms per step: the window form ran half its lanes on padding (resnet's 3x3 convs over 4x4
      maps: 33-68 us, 22-28 by channel; mobilevit's 40-channel one 26.8, 18.7). By channel, each tile
      stages its weights transposed ([cl][kh][kw][col], strided loads) and moves each block's sums in and
      out of the channel-major accumulator element by element: over 8 pixels (80 -> 80 channels 3x3, in
      2x4 tiles: 43.7 us, 59.6 by channel) or 128 terms (convnext's 2x2 downsampling of 32 channels: 14.3,
      18.5) that cost more than the padded lanes.
    A 1x1 stride-1 conv over narrow rows keeps the window form: its rows are contiguous, the lane loop one
    short vector, and by channel measured 1.2-1.5x slower (mobilenetv2's 24 -> 144 channels over 4x4).
    benchmarks/NOTES.md narrowbychannel."""
    co, oh, ow = c.out
    if c.depthwise:
        return False
    if c.taps == (1, 1) and c.strides == (1, 1):
        return oh * ow < lanes <= co
    if not ow < lanes <= co or co % lanes:
        return False
    return _window_rows_in_place(c) or (oh * ow >= 2 * lanes and c.bc * c.taps[0] * c.taps[1] >= BY_CHANNEL_TERMS)


BY_CHANNEL_TERMS = 256  # (input channel, tap) terms per step under which a staged narrow conv keeps the window form


DW_BY_CHANNEL_COLS = 8  # output columns under which a depthwise conv runs with its channels in the lanes


def depthwise_by_channel(c, lanes: int) -> bool:
    """Whether a window-form depthwise conv runs with its output channels in the vector lanes: its tile's
    rows are under DW_BY_CHANNEL_COLS columns (along columns a chunk of at least 8 lanes would be mostly
    idle: convnext's 7x7 convs over 4x4 images measured 2.8x their model, 4.7x over 2x2), its channels fill
    whole vectors, and the channels-last window and the tap-major weights fit a thread's stack (MAX_LINE)."""
    co, _, ow = c.out
    wh, ww = c.window
    return (c.depthwise and lanes >= 8 and ow < DW_BY_CHANNEL_COLS and co >= lanes and co % lanes == 0
            and (wh * ww + c.taps[0] * c.taps[1]) * co <= MAX_LINE)


DW_SUMS = 8  # partial-sum vectors of a by-channel depthwise block: 4 cycles of FMA latency x 2 FMAs per cycle


def depthwise_blocking(vectors: int, ow: int, lanes: int) -> tuple[int, int]:
    """(channel vectors per group, pixels of a row per block) of a by-channel depthwise conv: up to 4 pixels
    (each tap's weight vectors shared by them; its input vectors are each used once) and the largest
    divisor of `vectors` that keeps the block at DW_SUMS partial sums. More sums do not fit beside the
    window vectors GCC keeps live from one tap column to the next: convnext's 64-channel 7x7 convs at 4
    vectors x 4 pixels spilled and ran slower than the window form."""
    pixels = max(1, min(ow, 4))
    group = max(d for d in range(1, vectors + 1) if vectors % d == 0 and (d == 1 or d * pixels <= DW_SUMS))
    return group, pixels


def by_channel_blocking(vectors: int, ow: int, lanes: int) -> tuple[int, int]:
    """(channel vectors per group, pixels of a row per block) of a by-channel pointwise conv whose `vectors`
    vectors of output channels fill its tile: the partial sums of group x pixels in named vector registers,
    at most half of the registers (AVX-512's 32, AVX2's 16), the rest for the group's weight vectors and
    the pixels' broadcast inputs; a group the largest divisor of `vectors` up to half of those sums."""
    sums = 16 if lanes >= 16 else 8
    group = max(d for d in range(1, min(vectors, sums // 2) + 1) if vectors % d == 0)
    return group, max(1, min(ow, sums // group))


def conv_tails(chunk: int, lanes: int) -> tuple[int, ...]:
    """Widths of the whole-chunk tails after the loop over `chunk`-column chunks of an input read in
    place (no padded staged row to read past the tile's columns): one vector's worth with AVX-512, then
    chunks of 8 (the narrowest, at which the last few live columns run too)."""
    return ((16,) if chunk > 16 and lanes == 16 else ()) + ((8,) if chunk > 8 else ())


# Partial sums per register block below which a depthwise conv's FMA chain is latency-bound (4 cycles
# of FMA latency, 2 FMAs per cycle; measured: 28 % of a convnext segment waiting on one chain).
TWO_CHAINS_BELOW = 4


def split_chains(kernel: Kernel) -> Kernel:
    """Each window-form depthwise conv with more than one tap row: register blocks of fewer than
    TWO_CHAINS_BELOW partial sums (a tile one output row high) add even tap rows to one chain of sums
    and odd ones to a second, summed at the end (Conv.two_chains_below; a different summation order,
    within rounding). Dense convs have enough sums across their channels; others keep one chain."""
    def split(bare: Kernel, p: Phase) -> dict | None:
        c = p.conv
        if c is None or c.dot_lanes or not c.depthwise or c.taps[0] < 2:
            return None
        return {"two_chains_below": TWO_CHAINS_BELOW}

    return _map_phases(kernel, split) if kernel.convs else kernel


def window_interiors(kernel: Kernel) -> Kernel:
    """Each window-form conv that stages its input window: the window positions where every padded
    load and pad guard of the input factor is inside its tensor (conv.window_interior), recorded in
    Conv.interior; the C printer stages those rows' middle columns without checks, vectorised."""
    def interior(bare: Kernel, p: Phase) -> dict | None:
        c = p.conv
        if c is None or c.dot_lanes or c.x_in_place:
            return None
        full = {v: (0, s * (n - 1) + d * (k - 1))
                for v, n, s, k, d in zip(c.window_vars, p.region.shape[2:], c.strides, c.taps, c.dilations)}
        inner = window_interior(c, full, lambda t: bare.buffer(t).shape)
        return None if inner is None else {"interior": inner}

    return _map_phases(kernel, interior) if kernel.convs else kernel


def _window_rows_in_place(c) -> bool:
    """Whether the input factor is one unpadded fp32 load whose last index is the window column plus a
    constant and no other index holds it: a window row is then a row of the tensor itself (strided by
    the conv's column stride) and needs no staging. A column stride above 2 is staged anyway: read in
    place, every vector operand would be a strided gather (ViT's 8x8/8 patch conv: 286 µs in place, 47
    staged and de-interleaved; benchmarks/RESULTS.md vitconv)."""
    x = c.x
    if not isinstance(x, E.Load) or x.pad is not None or not x.index or x.dtype != DType.F32 or c.strides[1] > 2:
        return False
    w = c.window_vars[1]
    return x.index[-1].terms == ((I.Var(w), 1),) and not any(w in ix.vars() for ix in x.index[:-1])


def contiguous_along(kernel: Kernel, operand, inner: str, outer: str) -> bool:
    """Whether staging `operand` reads memory contiguously with `inner` as the innermost loop rather
    than `outer`: more of its loads step by one element along `inner` than along `outer`."""
    score = 0
    for x in kwalk(operand):
        if isinstance(x, E.Load) and x.index:
            score += (flat_stride(kernel, x, inner) == 1) - (flat_stride(kernel, x, outer) == 1)
    return score > 0


def conv_chunk(cols: int, lanes: int) -> int:
    """Output columns a C convolution keeps in registers at once. With AVX-512 (16 lanes): one or two
    vectors (16 or 32 columns), the wider unless it pads more, 8 for narrow tiles. Otherwise (GCC keeps
    up to four AVX2 vectors of partial sums in registers across the channel and tap loops): the widest
    divisor of the tile's columns from 8 to 32 (no partial chunk, whose variable trip count sends the
    sums to memory), else the widest of 32/24/16 whose padding wastes at most an eighth, else 8.
    Measured on conv_bn_relu / mobilenetv2_block (one thread, Zen 4): AVX-512 blocking 460 / 2980 us
    against 529 / 3880 us held to AVX2."""
    if lanes == 16:
        if cols <= 8:
            return 8
        return 32 if -(-cols // 32) * 32 <= -(-cols // 16) * 16 else 16
    for v in range(min(cols, 32), 7, -1):
        if cols % v == 0:
            return v
    for v in (32, 24, 16):
        if -(-cols // v) * v - cols <= cols / 8:
            return v
    return 8


def conv_channels(cols: int, out_channels: int, lanes: int) -> int:
    """Output channels a C convolution updates together per chunk of `cols` columns (each loaded
    window vector feeds one FMA per channel): channels x ceil(cols / lanes) partial-sum vectors plus
    one broadcast weight per channel in 24 of AVX-512's 32 registers (8, 4 or 2 channels;
    mobilenetv2_block's 1x1 conv one thread 770 -> 445 us from 4 to 8) or 12 of AVX2's 16 (4 or 2;
    the window loads and addresses need the rest: more spills)."""
    nv = -(-cols // lanes)
    if lanes == 16:  # 32 registers
        return next((n for n in (8, 4, 2) if n <= out_channels and n * nv + n <= 24), 1)
    return next((n for n in (4, 2) if n <= out_channels and n * nv + n <= 12), 1)


def conv_rows(cols: int, out_rows: int, channels: int, lanes: int) -> int:
    """Output rows a C convolution updates together per chunk of `cols` columns and `channels`
    channels: enough independent partial-sum vectors (channels x rows x ceil(cols / lanes)) to cover
    the FMA latency x throughput (4 x 2 on current x86 cores), at most 12 AVX2 registers (the
    broadcast weights and loads need the rest), and no more rows than the tile has. With AVX-512 a
    micro-tile of several channels takes one row (each row adds its own window loads: conv_bn_relu
    one thread 455 us at one row, 490 at two, 559 at three) and a lone channel up to 8 vectors."""
    nv = -(-cols // lanes)
    if lanes == 16:
        return 1 if channels > 1 else max(1, min(4, 8 // nv, out_rows))
    return max(1, min(4, 12 // (channels * nv), out_rows))


# ---- tiled GEMMs ------------------------------------------------------------------------------------


def block_gemms(kernel: Kernel, lanes: int = 0) -> Kernel:
    """Each tiled GEMM's C micro-kernel: GEMM_ROWS x GEMM_COLS register blocks (the tail rows over the
    widest of 4, 2, 1 x GEMM_COLS columns dividing the padded row), held in named `lanes`-float vectors
    where a chunk spans several (Gemm.c_vector; 0 lanes: float arrays), which factors are read in place
    (`in_place_strides`), dot products over k (GEMV) for tiles of at most GEMV_ROWS rows whose B is
    contiguous along k (or of at most GEMV_COLS columns whose A is too), and per segment the GEMMs that
    keep B in per-thread panels (`panel_gemms`)."""
    if not kernel.gemms:
        return kernel

    from engine.codegen.printer import invariant_picks

    # Named vectors at 8 and 16 lanes (at 16 only the tail rows' chunks span several); 4-lane targets keep
    # the arrays: 4x16 would be 16 named sums, every register SSE has (unmeasured).
    vector = lanes if lanes in (8, 16) and GEMM_COLS % lanes == 0 else 0

    def block(bare: Kernel, p: Phase) -> dict | None:
        g = p.gemm
        if g is None:
            return None
        ldb = -(-g.bn // GEMM_COLS) * GEMM_COLS
        wide = next(c for c in (4 * GEMM_COLS, 2 * GEMM_COLS, GEMM_COLS) if ldb % c == 0)
        a_in, b_in = in_place_strides(bare, p, "a"), in_place_strides(bare, p, "b")
        gemv = 0
        few_rows = g.bm <= GEMV_ROWS and g.bm * g.k <= MAX_LINE
        # Few columns (nerf's sigma and RGB heads, 1 and 3): the micro-kernel pads them to GEMM_COLS.
        few_cols = g.bn <= GEMV_COLS and g.k >= GEMV_LANES and a_in is not None and a_in[1] == 1
        if b_in is not None and b_in[1] == 1 and (few_rows or few_cols):
            gemv = GEMV_LANES
        elif b_in is not None and (b_in[0] != 1 or (g.bm > GEMM_ROWS and _rows_share_sets(b_in[1], g.bk))):
            b_in = None
        r = p.region.rank
        rows_inner = contiguous_along(bare, g.a, f"i{r - 2}", g.vars[-1])
        # With A staged its panel (bm x run floats) stays within the staging budget the step was chosen for.
        most = K_RUN_MOST if a_in is not None else max(1, C_STAGE_BYTES // (4 * max(1, g.bm)))
        krun = k_run(g.k, g.bk, b_in[1], most) if b_in is not None and not gemv else 0
        return {"c_rows": GEMM_ROWS, "c_cols": GEMM_COLS, "c_wide": wide, "c_vector": vector,
                "a_in": a_in or (), "b_in": b_in or (), "c_krun": krun if krun > g.bk else 0,
                "gemv": gemv, "b_k_inner": contiguous_along(bare, g.b, g.vars[-1], f"i{r - 1}"),
                "a_rows_inner": rows_inner,
                "a_row_picks": not a_in and not rows_inner and bool(invariant_picks(bare, g.a, set(g.vars)))}

    kernel = _map_phases(kernel, block)
    bare = kernel.stripped()
    segments = []
    for seg, bseg in zip(kernel.segments, bare.segments):
        stages, axis = panel_gemms(bare, bseg)
        if stages:
            seg = dataclasses.replace(seg, panel_axis=axis, phases=tuple(
                dataclasses.replace(p, gemm=dataclasses.replace(p.gemm, panel=True)) if p.stage in stages else p
                for p in seg.phases))
        segments.append(seg)
    return dataclasses.replace(kernel, segments=tuple(segments))


def in_place_strides(kernel: Kernel, phase: Phase, which: str) -> tuple[int, int] | None:
    """(elements one step of its row (a) / column (b) axis moves it, elements one step of flat k moves
    it) of factor `which` when it is one float load with no pad guard whose address is affine in that
    axis and in flat k — nothing computed in the load, so reading it in place gives the same value as
    staging it; else None. `kernel` without Inlined markers (Kernel.stripped)."""
    g = phase.gemm
    load = g.a if which == "a" else g.b
    if not isinstance(load, E.Load) or load.pad is not None or not load.index or load.dtype != DType.F32:
        return None
    if kernel.buffer(load.tensor).dtype != DType.F32:
        return None
    r = phase.region.rank
    if which == "a" and g.rows > 1:  # rows over several axes: no single row stride
        return None
    outer = flat_stride(kernel, load, f"i{r - 2}" if which == "a" else f"i{r - 1}")
    strides = [flat_stride(kernel, load, v) for v in g.vars]
    if outer is None or None in strides:
        return None
    inner = 1
    for s, n in zip(reversed(strides), reversed(g.extents)):
        if s != strides[-1] * inner:  # k's variables must flatten to one affine step
            return None
        inner *= n
    return outer, strides[-1]


K_RUN_MOST = 256  # k steps a micro-kernel runs with its sums in registers, B read in place (ctarget.k_run)


def k_run(k: int, bk: int, b_stride: int, most: int = K_RUN_MOST) -> int:
    """k steps the C micro-kernel runs between loading and storing its partial sums where B is read in place:
    the staging step `bk` doubled while B's rows `b_stride` floats apart still do not crowd L1's sets
    (`_rows_share_sets`, the rule that lets B be read in place), up to k and `most` (K_RUN_MOST; with A staged,
    the run its panel fits the staging budget in). The step is the staging budget's for both panels (48 KiB of
    a bk x tile panel: 8 for bert-base's 32 x 768 LayerNorm tiles of its FFN down projection), which B read in
    place does not need; every 8 steps the block's 96 KiB of sums went out to L2 and back: 4.9 ms for the
    kernel against 2.8 at 16 (benchmarks/NOTES.md krun). Each sum still adds its k terms in order."""
    run = max(1, bk)
    while run * 2 <= min(k, most) and not _rows_share_sets(b_stride, run * 2):
        run *= 2
    return run


def _rows_share_sets(stride: int, bk: int) -> bool:
    """Whether the bk rows of B read in place `stride` floats apart crowd into too few L1 sets for
    the next row group to find them there: rows a multiple of 4 KiB apart all fall in one set.
    Measured on bert's 16x256 tiles of B [768, 3072] (rows 12 KiB apart): in place 18.1 ms for
    the kernel against 9.6 staged; rows 1.5 KiB apart (vit's 384-wide B) gain from it."""
    offsets = L1_WAY_BYTES // math.gcd(4 * abs(stride), L1_WAY_BYTES) if stride else 1
    return -(-bk // min(offsets, L1_WAY_BYTES // 64)) > B_LINES_PER_SET


def panel_gemms(kernel: Kernel, seg: Segment) -> tuple[set[str], int]:
    """(stages, tile axis): GEMM phases of `seg` (blocked by `block_gemms`) whose B is staged and
    depends on the column tile alone (a weight), each then staging B's whole k range for one column
    tile into a per-thread panel when a thread's tile moves to another column tile instead of per
    tile, the tiles walked column tile by column tile along that axis. bert's FFN1 (16-row tiles of
    LayerNorm + 768x3072 GEMM) restaged its 786 KB column panel 96 times per run, 8x what it reads."""
    if seg.ntiles < 2 or any(p.region.table for p in seg.phases) \
            or any(b.region is not None and b.region.table for b in kernel.locals):
        return set(), -1
    found, axes = set(), set()
    for p in seg.phases:
        g = p.gemm
        if g is None or p.region.flat or g.gemv or g.b_in:
            continue
        r = p.region.rank
        span = p.region.spans[-1] if p.region.spans else None
        moves = [k for k, c in enumerate(span.coeffs) if c] if span is not None else []
        ldb = -(-g.bn // g.c_cols) * g.c_cols
        if span is None or span.clamp or len(moves) != 1 or p.region.tiles[moves[0]] >= p.region.ntiles \
                or not free_vars(g.b) <= {f"i{r - 1}", *g.vars} or g.k * ldb * 4 > PANEL_BYTES:
            continue
        found.add(p.stage)
        axes.add(moves[0])
    if len(axes) != 1:
        return set(), -1
    return found, axes.pop()


# ---- row caches --------------------------------------------------------------------------------------


def cache_rows(kernel: Kernel) -> Kernel:
    """Each segment's row caches (`find_row_caches`, on what the printer renders) in Segment.row_caches."""
    segments = tuple(dataclasses.replace(seg, row_caches=tuple(find_row_caches(bseg)))
                     for seg, bseg in zip(kernel.segments, kernel.stripped().segments))
    return dataclasses.replace(kernel, segments=segments)


def _occurs(body, target) -> bool:
    """Whether `target` is a subexpression of `body` outside pad guards and inlined reductions."""
    stack = [body]
    while stack:
        e = stack.pop()
        if e == target:
            return True
        if not isinstance(e, (Guard, Reduce)):
            stack.extend(E.children(e))
    return False


def _row_reread(prod: Phase, cons: Phase) -> RowCache | None:
    """The cache of `prod`'s terms for `cons` (named later) when `cons` is a one-axis reduction over
    the same rows and length whose body holds the same term."""
    if cons.combine is None or cons.reduce != prod.reduce or cons.gemm is not None \
            or cons.region.spans != prod.region.spans or cons.region.shape != prod.region.shape:
        return None
    rows = prod.region.rank
    if not free_vars(prod.body) <= {"r0", *(f"i{d}" for d in range(rows))} or not _occurs(cons.body, prod.body):
        return None
    extents = tuple(sp.ext for sp in prod.region.spans)
    return RowCache("", prod.stage, cons.stage, prod.body, rows, extents, prod.reduce[0])


def find_row_caches(seg: Segment) -> list[RowCache]:
    """Row caches of a segment: a one-axis reduction whose term is more than one load and appears
    again in a later phase over the same rows, either a reduction over the same r0 or, with r0 read
    as the innermost index, an elementwise phase whose innermost axis spans exactly the reduced length
    (softmax's max/sum/normalise phases). At most MAX_LINE floats per tile in all."""
    out: list[RowCache] = []
    for k, prod in enumerate(seg.phases):
        if (prod.combine is None or len(prod.reduce) != 1 or prod.gemm is not None or prod.region.flat
                or not prod.region.spans or isinstance(prod.body, (E.Load, E.Imm))
                or prod.combine in (Combine.ARGMAX, Combine.ARGMIN)):
            continue
        n = prod.reduce[0]
        for cons in seg.phases[k + 1:]:
            if cons.region.flat or not cons.region.spans:
                continue
            again = _row_reread(prod, cons)
            if again is not None:
                if again.size + sum(c.size for c in out) <= ROW_CACHE_FLOATS:
                    out.append(dataclasses.replace(again, name=f"row{len(out)}"))
                break
            rc = cons.region.rank
            if cons.combine is not None or cons.gemm is not None or not rc or prod.region.rank not in (rc - 1, rc):
                continue
            last = cons.region.spans[-1]
            if (last.base, last.ext, last.clamp, any(last.coeffs)) != (0, n, False, False) \
                    or cons.region.shape[-1] != n:
                continue
            rows = rc - 1
            if prod.region.rank == rc and prod.region.shape[-1] != 1:
                continue
            if any(prod.region.spans[d] != cons.region.spans[d] for d in range(rows)):
                continue
            if not free_vars(prod.body) <= {"r0", *(f"i{d}" for d in range(rows))}:
                continue
            term = substitute_body(prod.body, {"r0": I.var(f"i{rc - 1}")})
            extents = tuple(cons.region.spans[d].ext for d in range(rows))
            cache = RowCache(f"row{len(out)}", prod.stage, cons.stage, term, rows, extents, n)
            if _occurs(cons.body, term):
                if cache.size + sum(c.size for c in out) <= ROW_CACHE_FLOATS:
                    out.append(cache)
                break
    return out


# ---- divisions by a row's value ------------------------------------------------------------------------


def reciprocal_rows(kernel: Kernel) -> Kernel:
    """Each per-element phase whose innermost axis is a loop (not one-wide on every tile) with its
    float32 divisions by a value of the row (`reciprocal_divisions` along that axis)."""
    segments = []
    for seg in kernel.segments:
        phases = []
        for p in seg.phases:
            r = p.region.rank
            if p.gemm is None and p.conv is None and not p.region.flat and p.combine is None and r \
                    and not one_wide(p.region, r - 1):
                p = dataclasses.replace(p, body=reciprocal_divisions(p.body, f"i{r - 1}"))
            phases.append(p)
        segments.append(dataclasses.replace(seg, phases=tuple(phases)))
    return dataclasses.replace(kernel, segments=tuple(segments))


def reciprocal_divisions(body, var: str):
    """`body` with float32 divisions x / y, x varying along `var` and y not (a softmax row's sum, a
    LayerNorm row's sqrt(var + eps)), as x * (1 / y): the reciprocal is then computed once per row
    and the column loop multiplies; a vector divide costs several multiplies. Within 1.5 ulp of the
    quotient (the printers' results are compared at 1e-3 relative), as onnxruntime's kernels do."""
    memo: dict = {}

    def visit(e):
        if isinstance(e, E.Binary) and e.op == "div" and e.dtype == DType.F32 \
                and var in free_vars(e.a, memo) and var not in free_vars(e.b, memo):
            return E.Binary("mul", e.a, E.Unary("recip", e.b, e.dtype), e.dtype)
        return e

    return kmap(body, visit)


def one_wide(region, d: int) -> bool:
    """Whether axis d of the region spans exactly one index on every tile."""
    if region.spans:
        return region.spans[d].ext == 1 and not region.spans[d].clamp
    return all(row[region.rank + d] - row[d] == 1 for row in region.table)


# ---- line caches -------------------------------------------------------------------------------------------


def cache_lines(kernel: Kernel) -> Kernel:
    """Expensive subexpressions of one loop variable alone (`_line_values`) that the nest would recompute
    for every row: per segment the LineCaches computed once per launch where the variable's range is the
    same in every tile and the value reads only global tensors (Segment.launch_lines; each phase's reads
    of them in Phase.line_reads), per phase the rest computed once per tile (Phase.tile_lines) — on the
    CPU the blocks are iterations of one loop, so nothing is gained by each recomputing them."""
    bare = kernel.stripped()
    segments = []
    for seg, bseg in zip(kernel.segments, bare.segments):
        launch, reads = _launch_lines(bare, bseg)
        phases = []
        for p, bp in zip(seg.phases, bseg.phases):
            axis = _line_axis(bp)
            if axis is not None:
                var, ext, rows = axis
                nodes = _line_values(bp.body, var)
                p = dataclasses.replace(
                    p, line_reads=tuple((n, *reads[n]) for n in nodes if n in reads),
                    tile_lines=tuple(n for n in nodes if n not in reads) if rows > 1 and ext <= MAX_LINE else ())
            phases.append(p)
        segments.append(dataclasses.replace(seg, phases=tuple(phases), launch_lines=launch))
    return dataclasses.replace(kernel, segments=tuple(segments))


def _line_axis(p: Phase) -> tuple[str, int, int] | None:
    """(variable, extent, rows) of a per-element phase's line caches: its lone reduction axis over every
    element, or its innermost axis over the rows before it."""
    if p.gemm is not None or p.conv is not None or p.region.flat:
        return None
    r = p.region.rank
    if p.combine is not None and len(p.reduce) == 1:
        return "r0", p.reduce[0], math.prod(p.region.extent)
    if p.combine is None and r:
        return f"i{r - 1}", p.region.extent[-1], math.prod(p.region.extent[:-1])
    return None


def _launch_lines(kernel: Kernel, seg: Segment) -> tuple[tuple[LineCache, ...], dict]:
    """The segment's launch line caches, one per chain (over a canonical variable) and range, and
    value -> (array, lo) for every phase value read from one."""
    if seg.ntiles < 2:
        return (), {}
    globals_ = {b.name for b in kernel.params}
    made: dict = {}  # (chain over a canonical variable, lo, hi) -> array
    caches: list[LineCache] = []
    reads: dict = {}
    for phase in seg.phases:
        if phase.gemm is not None or phase.conv is not None or phase.region.flat:
            continue
        r = phase.region.rank
        if phase.combine is not None and len(phase.reduce) == 1:
            var, lo, hi = "r0", 0, phase.reduce[0]
        elif phase.combine is None and r and phase.region.spans:
            span = phase.region.spans[-1]
            if span.clamp or any(span.coeffs):
                continue
            var, lo, hi = f"i{r - 1}", span.base, span.base + span.ext
        else:
            continue
        if hi - lo > 4 * MAX_LINE:
            continue
        for node in _line_values(phase.body, var):
            if node in reads or any(isinstance(x, E.Load) and x.tensor not in globals_ for x in kwalk(node)):
                continue
            key = (substitute_body(node, {var: I.var("line_")}), lo, hi)
            if key in made:
                reads[node] = (made[key], lo)
                continue
            name = made[key] = f"launch_line{len(made)}"
            caches.append(LineCache(name, node, var, lo, hi))
            reads[node] = (name, lo)
    return tuple(caches), reads


def _line_values(body, var: str) -> list:
    """Maximal float subexpressions of `body` depending on `var` alone and holding a transcendental
    (none under a pad guard or inside an inlined reduction)."""
    found: list = []
    stack = [body]
    while stack:
        e = stack.pop()
        if isinstance(e, (Guard, Reduce)):
            continue
        if getattr(e, "dtype", None) is not None and e.dtype.is_float and free_vars(e) == {var} \
                and any(map(transcendental, kwalk(e))) and e not in found:
            found.append(e)
            continue
        stack.extend(E.children(e))
    return found


# ---- index-set splitting --------------------------------------------------------------------------------

MAX_PIECES = 8  # pieces one innermost loop is split into at most (each prints the loop body once)


def split_ranges(kernel: Kernel) -> Kernel:
    """Per element-wise phase whose body tests its innermost output variable alone (affine) — a concatenation
    along that axis (its select), a bounds guard or padded load along it — the positions where such a test
    changes value (`index_cuts`, Phase.splits), where they make at most MAX_PIECES pieces.
    The C printer runs the innermost loop in those pieces, each printed with the tests folded: a
    branch-free vector loop. Under `omp simd` an `if` or a ternary becomes a mask and both sides run on
    every lane: zoo nerf's stitched concatenation of a GEMM's 128 columns, 3 view directions and 12 + 12
    sin/cos features ran the cosine (and every guarded load) on all 155 columns of each row, where the
    work count charges it on the 12 it is taken on (measured 6.6x its modeled time, benchmarks/NOTES.md
    "splitranges")."""
    bare = kernel.stripped()
    segments = []
    for seg, bseg in zip(kernel.segments, bare.segments):
        phases = []
        for p, bp in zip(seg.phases, bseg.phases):
            r = bp.region.rank
            if bp.gemm is None and bp.conv is None and bp.combine is None and not bp.region.flat and r \
                    and not one_wide(bp.region, r - 1):
                cuts = index_cuts(bare, bp.body, f"i{r - 1}", bp.region.shape[r - 1])
                if cuts and len(cuts) < MAX_PIECES:
                    p = dataclasses.replace(p, splits=cuts)
            phases.append(p)
        segments.append(dataclasses.replace(seg, phases=tuple(phases)))
    return dataclasses.replace(kernel, segments=tuple(segments))


def index_cuts(kernel: Kernel, body, var: str, n: int) -> tuple[int, ...]:
    """The positions 0 < t < n where a test in `body` of `var` alone changes value between var = t - 1 and
    var = t: an index comparison against a constant (E.Select's condition), a Guard's or InBounds' bounds,
    a padded load's bounds — each of an affine index k * var + c."""
    cuts: set[int] = set()
    for x in kwalk(body):
        for k, c, test in _var_tests(kernel, x, var):
            for m in test.edges:  # k * t + c crosses m near t = (m - c) / k: the flip lies among these
                base = (m - c) // k
                for t in range(base - 1, base + 3):
                    if 0 < t < n and test(k * (t - 1) + c) != test(k * t + c):
                        cuts.add(t)
    return tuple(sorted(cuts))


@dataclasses.dataclass(frozen=True)
class _Test:
    """A test of one integer value: `op` against `m` (E.COMPARE_OPS), or 0 <= value < m for "in"."""

    op: str
    m: int

    @property
    def edges(self) -> tuple[int, ...]:
        return (0, self.m) if self.op == "in" else (self.m,)

    def __call__(self, v: int) -> bool:
        return 0 <= v < self.m if self.op == "in" else E.COMPARE[self.op](v, self.m)


def _var_tests(kernel: Kernel, x, var: str) -> list[tuple[int, int, _Test]]:
    """(k, c, test) for each test node `x` makes of an index k * var + c (var alone, k != 0)."""
    from engine.codegen.kexpr import InBounds

    def alone(ix) -> tuple[int, int] | None:
        if isinstance(ix, I.Lin) and len(ix.terms) == 1 and ix.terms[0][0] == I.Var(var) and ix.terms[0][1]:
            return ix.terms[0][1], ix.const
        return None

    out = []
    if isinstance(x, E.Select) and (hit := E.index_comparison(x.cond)) is not None \
            and (kc := alone(hit[0])) is not None:
        out.append((*kc, _Test(hit[1], hit[2])))
    bounded = []
    if isinstance(x, (Guard, InBounds)):
        cond = x.cond if isinstance(x, Guard) else x
        bounded = list(zip(cond.index, cond.shape))
    elif isinstance(x, E.Load) and x.pad is not None and x.index:
        bounded = list(zip(x.index, kernel.buffer(x.tensor).shape))
    for ix, size in bounded:
        if (kc := alone(ix)) is not None:
            out.append((*kc, _Test("in", size)))
    return out


# ---- column-wise sums -----------------------------------------------------------------------------------


def sum_columns(kernel: Kernel) -> Kernel:
    """Per phase whose innermost axis is a loop of at most MAX_LINE columns, the `axpy_sums` of its body
    (of the phase's own sum as one inlined sum, for a sum phase whose terms no row cache keeps), run
    column-wise before that loop (Phase.column_sums): attention's probabilities @ V per head, which the
    GEMM path does not take, and mobilevit's projections."""
    bare = kernel.stripped()
    segments = []
    for seg, bseg in zip(kernel.segments, bare.segments):
        kept = {c.producer for c in bseg.row_caches}
        phases = []
        for p, bp in zip(seg.phases, bseg.phases):
            r = bp.region.rank
            if bp.gemm is None and bp.conv is None and not bp.region.flat and r and not one_wide(bp.region, r - 1) \
                    and bp.region.extent[r - 1] <= MAX_LINE:
                body = bp.body if bp.combine is None else None
                if bp.combine == Combine.SUM and bp.stage not in kept:
                    body = Reduce(bp.body, tuple(f"r{k}" for k in range(len(bp.reduce))), bp.reduce, bp.combine,
                                  bp.dtype)
                if body is not None:
                    p = dataclasses.replace(p, column_sums=tuple(axpy_sums(bare, body, f"i{r - 1}")))
            phases.append(p)
        segments.append(dataclasses.replace(seg, phases=tuple(phases)))
    return dataclasses.replace(kernel, segments=tuple(segments))


def axpy_sums(kernel: Kernel, body, var: str) -> list[Reduce]:
    """Inlined sums in `body` (not under a guard or another reduction) that a phase's innermost loop
    over `var` should run column-wise: their summands read memory contiguously along `var` (a weight
    row B[k, j]) or not at all, never contiguously along the sum's own innermost variable, so
    `for k: for j (simd): acc[j] += a(k) * B[k, j]` streams rows where the per-element form walks a
    column of B for every output (mobilevit's attention projections: 4 x 2 x 32 regions, which the
    GEMM path does not take, ran as scalar dot products down strided columns)."""
    found, stack = [], [body]
    while stack:
        n = stack.pop()
        if isinstance(n, Guard):
            continue
        if not isinstance(n, Reduce):
            stack.extend(kchildren(n))
            continue
        if n.combine != Combine.SUM or n.dtype != DType.F32 or var not in free_vars(n.body) \
                or any(isinstance(x, (Reduce, Guard)) and x is not n for x in kwalk(n.body) if var in free_vars(x)):
            continue
        loads = [x for x in kwalk(n.body) if isinstance(x, E.Load) and x.index and var in free_vars(x)]
        strides = [(flat_stride(kernel, x, var), flat_stride(kernel, x, n.vars[-1])) for x in loads]
        if loads and all(sv in (1, None) and sk != 1 for sv, sk in strides) and any(sv == 1 for sv, _ in strides):
            found.append(n)
    return found


# ---- OpenMP -------------------------------------------------------------------------------------------


def schedule_segments(kernel: Kernel, loops: str | None = None) -> Kernel:
    """How the threads share each segment's tiles. "serial": under SERIAL_WORK element-steps the calling
    thread runs them (waking a team costs more than it saves). "static": a matrix-vector product
    streaming a weight too big for one core's L1 but not for the cores' L2s together (lstm's 1 MB
    recurrent weight, once per step), from STREAM_WORK: every step each thread reads the same part of
    the weight, from its own L2. Else "guided": on a shared machine one thread may be descheduled for a
    whole time slice; with a static split the others then wait at the loop's end for its half of the
    tiles (~8 ms per kernel on 2 busy cores), with guided chunks they take its tiles instead; unlike
    dynamic (one tile per grab) it pays no atomic per tile (512 row tiles of LayerNorm ~1.5x slower).

    A parallel segment's loop runs on `loops` (default flags.c_loops(): TILEWEAVE_C_LOOPS), recorded as
    Segment.loops: "pool", the C header's tw_parallel_for, whose caller claims chunks too and waits only
    for chunks a worker claimed (a descheduled worker's tiles are taken, not waited for, where an OpenMP
    loop waits out its time slice), each claim at least CLAIM_WORK element-steps of tiles (Segment.chunk;
    0 for "static": one even share per thread); or "omp", the OpenMP loops."""
    from engine.flags import c_loops

    loops = loops or c_loops()
    segments = []
    for seg, bseg in zip(kernel.segments, kernel.stripped().segments):
        work = segment_work(bseg)
        omp = segment_loop(seg, work)
        chunk = 0 if omp != "guided" else max(1, -(-CLAIM_WORK * seg.ntiles // max(work, 1)))
        segments.append(dataclasses.replace(seg, omp=omp, work=work, loops="" if omp == "serial" else loops,
                                            chunk=chunk))
    return dataclasses.replace(kernel, segments=tuple(segments))


def segment_loop(seg: Segment, work: int) -> str:
    """"static", "serial" or "guided" for a segment of `work` element-steps (`segment_work` of its stripped
    form): the choice `schedule_segments` records, asked also by the cost model (engine/schedule/cost.py:
    a serial segment's tiles run one after another on one core)."""
    if _streams_weight(seg) and work >= STREAM_WORK:
        return "static"
    return "serial" if work < SERIAL_WORK else "guided"


def _streams_weight(seg: Segment) -> bool:
    """A segment holding a tiled GEMM of at most GEMV_ROWS rows per block (run as dot products), each such
    GEMM split over the tiles: with one every tile computes whole (lstm's welder kernel of two recurrence
    steps at 2 threads: each of its 2 tiles ran the first step's whole 512 x 128 GEMV, then half the
    second's), the threads do not each read their part of the weight — they all read all of it, and the
    tiles do 1.5x the segment's work — so the segment is sized like any other (SERIAL_WORK)."""
    gemvs = [p for p in seg.phases if p.gemm is not None and p.gemm.bm <= GEMV_ROWS]
    return bool(gemvs) and seg.ntiles > 1 and not any(_whole_per_tile(p.region) for p in gemvs)


def _whole_per_tile(region) -> bool:
    """Each tile covers the whole tensor of this region (its box per tile is the full shape)."""
    return not region.flat and tuple(region.extent) == tuple(region.shape)


def segment_work(seg: Segment) -> int:
    """Element-steps of a segment: per phase, elements per tile times the reduction length (inlined
    reductions and tiled GEMM k included) times the body's weight (transcendentals count
    TRANSCENDENTAL_STEPS each), plus STAGE_STEPS per element of a conv's staged input window, times the
    tiles."""
    total = 0
    for p in seg.phases:
        elems = p.region.flat or math.prod(p.region.extent)
        inlined, expensive = _body_steps(p.body)
        steps = (math.prod(p.reduce) if p.reduce else 1) + inlined
        total += elems * element_steps(steps, expensive)
        if p.conv is not None and not _window_rows_in_place(p.conv):
            total += STAGE_STEPS * staged_window(p.conv)
    return total * seg.ntiles


def element_steps(steps: int, expensive: int) -> int:
    """Element-steps one element of a phase counts for: its steps (its reduction and those inlined into it)
    weighed by its transcendentals (TRANSCENDENTAL_STEPS each) — `segment_work`'s weight, which the cost
    model's floor bounds from the regions alone (`floor.serial_for_sure`)."""
    return steps * (1 + TRANSCENDENTAL_STEPS * expensive)


# Element-steps one element of a conv's staged input window counts for: staged row by row, border columns
# checked one by one, a strided input de-interleaved by column phase — ~0.4 ns an element measured (zoo
# mobilevit's 3x3 stride-2 depthwise conv over 64 channels of 32x32: 72 K staged elements, 37.5 µs on one
# core, which its 147 K element-steps of arithmetic had left serial), against ~0.05 ns an element-step.
STAGE_STEPS = 8


def staged_window(c) -> int:
    """Elements of a conv's input window one tile stages: its channels (the block's own when depthwise,
    else every input channel) times the window's rows and columns (capacity). Taken from the conv as
    generate builds it, before the C passes, so the cost model (`cost.serial_on`) and the C target count
    alike; the rows an unpadded input lets the window form read in place are left out by the caller."""
    wh, ww = c.window
    return (c.out[0] if c.depthwise else c.channels) * wh * ww


def _body_steps(body) -> tuple[int, int]:
    """(steps of the reductions inlined in `body`, its transcendentals), memoised on the body (the cost
    model asks for every segment it costs on a CPU: `cost.serial_on`)."""
    from engine.memo import memo

    table = memo("ctarget.body_steps", 50000)
    hit = table.get(id(body))
    if hit is None or hit[0] is not body:  # the body is kept so its id stays unique
        nodes = list(kwalk(body))
        hit = table.put(id(body), (body, (sum(math.prod(r.extents) for r in nodes if isinstance(r, Reduce)),
                                          sum(map(transcendental, nodes)))))
    return hit[1]


def transcendental(n) -> bool:
    return (isinstance(n, E.Unary) and n.op in _EXPENSIVE) or (isinstance(n, E.Binary) and n.op == "pow")
