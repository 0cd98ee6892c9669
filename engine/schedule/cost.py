"""Traffic cost model: a kernel group (stages, edge connections, one Tile per segment) and a Device
in, a GroupCost out — footprints, traffic in transactions per level, flops with REGISTER recompute,
occupancy, waves and every term of the modeled time."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from engine.codegen.mma import tf32_allowed
from engine.device import Device, resident_blocks_per_sm
from engine.ir import expr as E
from engine.ir.graph import PrimGraph, Stage, StageKind
from engine.memo import memo
from engine.schedule.plan import Conn, GroupCost, Tile
from engine.tilegraph.propagate import Box, box_size
from engine.tilegraph.tilegraph import (
    IN_SEGMENT,
    GroupRegions,
    anchor_box,
    inner_edges,
    propagate_group,
    segments_of,
    typical_index,
)

LINE = 128  # bytes per read transaction (L1/L2 line)
SECTOR = 32  # bytes per write transaction
BASE_REGS = 24  # indices, pointers, loop counters of any generated kernel


@dataclass(frozen=True)
class SegmentUse:
    """One segment's per-block view: its regions and resource use (also used by validate)."""

    stages: tuple[str, ...]
    tile: Tile
    regions: GroupRegions
    shared_bytes: int
    regs_per_thread: int
    evaluations: dict  # stage -> element evaluations per block (REGISTER recompute included)
    read_lines: dict  # tensor read from outside the segment -> 128 B lines per block
    shared_traffic: int  # bytes per block through shared memory
    flops_fp32: float  # per block
    flops_tc: float  # per block, on tensor cores (GEMMs printed with mma.sync: Work.mma_flops)
    global_bytes: float = 0.0  # per block: the kernel IR's global loads and stores
    work: object = None  # engine.codegen.count.Work of the whole segment (every tile)
    completion: tuple[str, ...] = ()  # stages finished by a completion phase (read outside, not covered)
    flops_tiled: float = 0.0  # per block: of flops_fp32, those in GEMM / direct-conv micro-tiles
    flops_idle_lanes: float = 0.0  # per block, CPU: flop slots short vector loops leave empty (`idle_lanes`)
    flops_tc_f16: float = 0.0  # per block: of flops_tc, those with fp16 operands (m16n8k16 .f16; the rest TF32)
    gemm_maps: tuple[tuple[int, int], ...] = ()  # (ty, tx) of each tiled GEMM phase, as codegen built it
    serial: bool = False  # CPU, several threads: the C target runs this segment's tiles on one thread (`serial_on`)
    reach: dict = field(default_factory=dict)  # tensor read from outside -> bytes the whole grid reads at least (`segment_reach`)
    flops_math: float = 0.0  # per block: of the per-element flops (fp32 - tiled), those of math ops (E.OP_FLOPS weights)


def at_kernel_block(tiles: Sequence[Tile]) -> list[Tile]:
    """Every segment of a kernel runs with the kernel's block: the largest of its tiles' thread counts (a
    segment on a block larger than its tile's runs that block's default thread mapping, as codegen does)."""
    kt = max(t.threads for t in tiles)
    table = memo("cost.kernel_block", 20000)  # the search asks per candidate, three times
    return [t if t.threads == kt else table.lookup((t, kt), lambda t=t: dataclasses.replace(t, threads=kt, thread_shape=()))
            for t in tiles]


def nbytes(graph: PrimGraph, tensor: str) -> int:
    spec = graph.specs[tensor]
    return math.prod(spec.shape) * spec.dtype.itemsize


def lines_of(box: Box, itemsize: int) -> int:
    """128-byte lines to read a box of a row-major tensor: each innermost run costs at least one."""
    if not box:
        return 1
    rows = box_size(box[:-1]) if len(box) > 1 else 1
    run = (box[-1][1] - box[-1][0]) * itemsize
    return rows * max(1, -(-run // LINE))


def load_axes(consumer: Stage, producer: str) -> tuple[frozenset[str], int]:
    """Variables the consumer's loads of `producer` depend on, and how many distinct loads there are."""
    key = (id(consumer.body), consumer.name, producer)
    table = memo("cost.load_axes", 50000)
    hit = table.get(key)
    if hit is None or hit[0] is not consumer.body:  # the body is kept so its id stays unique
        hit = table.put(key, (consumer.body, _load_axes(consumer, producer)))
    return hit[1]


def _load_axes(consumer: Stage, producer: str) -> tuple[frozenset[str], int]:
    used: set[str] = set()
    found = {n for n in E.walk(consumer.body) if isinstance(n, E.Load) and n.tensor == producer}
    for node in found:
        for ix in node.index:
            used |= ix.vars()
    return frozenset(used), max(1, len(found))


def thread_split_axes(stage: Stage, box: Box, tile: Tile) -> frozenset[str]:
    """Output axes of `stage` whose elements in `box` belong to different threads of a block.

    The innermost axis is a row: split when several threads share a row; the outer axes hold the
    block's rows, split when the block runs more than one row's worth of threads."""
    rank = len(stage.shape)
    out: set[str] = set()
    for k, (lo, hi) in enumerate(box):
        if hi - lo <= 1:
            continue
        inner = k == rank - 1
        if (inner and tile.threads_per_row > 1) or (not inner and tile.threads > tile.threads_per_row):
            out.add(f"i{k}")
    return frozenset(out)


def segment_use(graph: PrimGraph, segment: Sequence[str], conns: Mapping, tile: Tile,
                local: dict | None = None, exact: bool = False, device: Device | None = None) -> SegmentUse:
    """Per-block regions, footprint and evaluations of one segment under `tile` (memoised: the tile
    search and the validity checks ask for the same segment many times). `local`: a memo for callers
    whose `conns` stay fixed (one tile search), keyed on the segment and tile alone. The work counts
    come from the kernel IR realised at a typical (interior) tile standing for all, or with `exact` over
    every tile as `generate` builds it (edge tiles count as they print: the figure a chosen tile's cost
    reports, equal to the printed kernel's count). `device` picks the micro-kernel's parameters
    (engine/codegen/micro.py; the a100 preset's when None)."""
    if local is not None:
        lkey = ("use", tuple(segment), tile, exact, device, tf32_allowed())
        hit = local.get(lkey)
        if hit is None:
            hit = local[lkey] = segment_use(graph, segment, conns, tile, exact=exact, device=device)
        return hit
    members = set(segment)
    key = (graph.structural_hash, tuple(segment), inner_edges(graph, segment, conns), tile, exact, device,
           tf32_allowed())
    return memo("cost.segment_use", 50000).lookup(
        key, lambda: _alike_segment_use(graph, segment, conns, tile, members, exact, device))


def _alike_segment_use(graph: PrimGraph, segment: Sequence[str], conns: Mapping, tile: Tile, members: set,
                       exact: bool, device: Device | None) -> SegmentUse:
    """`_segment_use`, shared by the segments of one structure in a graph: kept under the segment's
    signature (`tiles.group_signature`: its stages, shapes, bodies and inner connections with the names
    canonical, and which stages are read outside it) with the connections of its edges out, its tile on the
    canonical anchor, and renamed to each segment's own names on the way out. A repeated layer's segments
    then build and count one kernel per tile: bert12's first layer and the next grow groups of different
    stages (the embeddings lead the first), so their group searches are not the same, but their segments
    are (benchmarks/NOTES.md "alikeseg")."""
    from engine.schedule.tiles import canonical_names, group_signature

    names = canonical_names(graph, segment)
    out = tuple((names[p], tuple(sorted(str(conns.get((p, c), Conn.KERNEL)) for c in graph.consumers.get(p, ())
                                        if c not in members))) for p in segment)
    key = (graph.structural_hash, group_signature(graph, segment, conns), out,
           dataclasses.replace(tile, stage=names[tile.stage]), exact, device, tf32_allowed())
    table = memo("cost.segment_use_alike", 50000)
    hit = table.get(key)
    if hit is not None:
        return _renamed_use(hit, {v: k for k, v in names.items()})
    use = _segment_use(graph, segment, conns, tile, members, exact, device)
    table.put(key, _renamed_use(use, names))
    return use


def _renamed_use(use: SegmentUse, m: Mapping[str, str]) -> SegmentUse:
    """`use` with its stage and tensor names mapped through `m` (names it does not hold kept)."""
    def keys(d: Mapping) -> dict:
        return {m.get(k, k): v for k, v in d.items()}

    r = use.regions
    work = use.work if use.work is None else dataclasses.replace(
        use.work, evals=keys(use.work.evals), loop_flops=dict(use.work.loop_flops), op_flops=dict(use.work.op_flops))
    return dataclasses.replace(
        use, stages=tuple(m.get(s, s) for s in use.stages),
        tile=dataclasses.replace(use.tile, stage=m.get(use.tile.stage, use.tile.stage)),
        regions=GroupRegions(m.get(r.anchor, r.anchor), keys(r.stages), keys(r.inputs), r.exact),
        evaluations=keys(use.evaluations), read_lines=keys(use.read_lines), work=work,
        completion=tuple(m.get(s, s) for s in use.completion), reach=keys(use.reach))


def _segment_use(graph: PrimGraph, segment: Sequence[str], conns: Mapping, tile: Tile, members,
                 exact: bool = False, device: Device | None = None) -> SegmentUse:
    regions = segment_regions(graph, segment, conns, tile)
    kernel, work = segment_work(graph, segment, conns, tile, False if exact else regions.stages, device)
    per = max(1, kernel.ntiles)
    evals = {s: work.evals.get(s, 0.0) / per for s in segment}
    lines = _read_lines(graph, regions, segment)
    completion = tuple(p.stage for seg in kernel.segments for p in seg.phases if p.region.flat)
    gemms = [p.gemm for seg in kernel.segments for p in seg.phases if p.gemm is not None]
    # a GPU thread holds its micro-tile's accumulators; the C target's micro-kernel is its own (4 x 16)
    gpu = device is not None and device.kind != "cpu"
    accumulators = max((g.tm * g.tn for g in gemms), default=0) if gpu else 0
    return SegmentUse(tuple(segment), tile, regions, kernel.shared_bytes,
                      segment_registers(graph, segment, tile, regions, accumulators),
                      evals, lines,
                      int(work.shared_bytes / per), (work.flops - work.mma_flops) / per, work.mma_flops / per,
                      work.global_bytes / per, work,
                      completion, work.tiled_flops / per, idle_lanes(work, device) / per, work.mma_f16_flops / per,
                      tuple((g.ty, g.tx) for g in gemms), serial_on(kernel, device),
                      segment_reach(graph, segment, conns, tile.stage),
                      max(0.0, min(sum(work.op_flops.values()), work.flops - work.mma_flops - work.tiled_flops)) / per)


def serial_on(kernel, device: Device | None) -> bool:
    """Whether the C target runs the (one-segment) `kernel`'s tiles serially on a CPU of several threads: a
    segment under ctarget.SERIAL_WORK element-steps is not worth waking the other threads for
    (`ctarget.segment_loop`, the choice `schedule_segments` records in Segment.omp). Its blocks then run
    one after another on one core, not spread over `sm_count`: lstm's per-step kernels at 2 threads (a
    2-tile step kernel recomputing the gates per tile modeled 2.9 us and measured 5.8: the model had
    halved it over two cores)."""
    if device is None or device.kind != "cpu" or device.sm_count <= 1 or len(kernel.segments) != 1:
        return False
    from engine.codegen.ctarget import segment_loop, segment_work

    seg = kernel.segments[0]  # its Inlined markers walked through: the same count as the stripped segment's
    return segment_loop(seg, segment_work(seg)) == "serial"


def segment_registers(graph: PrimGraph, segment: Sequence[str], tile: Tile, regions: GroupRegions,
                      accumulators: int = 0) -> int:
    """Registers per thread one segment's code needs under `tile` (formula): a contraction's accumulators
    (its anchor region over the threads, two registers each) or two per stage; where codegen tiled a
    GEMM, its micro-tile's tm x tn accumulators (`accumulators`: the thread mapping's register side)."""
    if graph.stage(tile.stage).kind == StageKind.CONTRACTION:
        acc = max(accumulators, -(-box_size(regions.stages.get(tile.stage, ())) // max(1, tile.threads)))
        return min(BASE_REGS + 2 * acc + 8, 999)
    own = BASE_REGS + 2 * len(segment)
    return min(max(own, BASE_REGS + 2 * accumulators + 8) if accumulators else own, 999)


def idle_lanes(work, device: Device | None) -> float:
    """Flop slots a CPU's vector lanes leave idle in the C target's code (`work`: the kernel IR's count),
    charged at the per-element rate like the flops themselves. 0 on a GPU (a reduction there is spread
    over threads, not lanes of one loop; its math functions are instructions).
    - Short reduction loops: the C target vectorises a reduction along its innermost loop (`omp simd
      reduction`; the element loop around it is then not vectorised), so a loop of n trips on L lanes
      runs ceil(n / L) vector iterations, each as dear as a full one: the flops inside it cost
      ceil(n / L) * L / n times as much (a 3x3 depthwise conv inlined into a per-element phase: its tap
      loop of 3 trips uses 3 of 16 lanes; mobilevit's welder k01 measured 5x the per-element rate there —
      a rate the probe takes from math functions, so the term holds with it, not with a plain-arithmetic
      rate: the count leaves out such a loop's guards and index arithmetic, benchmarks/NOTES.md).
      Sums the C target runs column-wise are not in `work.loop_flops` (engine/codegen/count.py).
    - Library calls: an op the C printer prints as a scalar libm call (CPrinter.scalar_calls; none since sin
      and cos became an inline helper that vectorises) runs on one lane, L times the cost of its vectorised
      flops (nerf's sin kernels measured ~10x as libm calls)."""
    if device is None or device.kind != "cpu" or device.vector_lanes <= 1:
        return 0.0
    from engine.codegen.targets import CPrinter

    lanes = device.vector_lanes
    short = sum(f * (-(-n // lanes) * lanes / n - 1.0) for n, f in work.loop_flops.items() if n > 0 and n % lanes)
    calls = sum(f * (lanes - 1) for op, f in work.op_flops.items() if op in CPrinter.scalar_calls)
    return short + calls


def segment_work(graph: PrimGraph, segment: Sequence[str], conns: Mapping, tile: Tile,
                 regions: Mapping | bool | None = None, device: Device | None = None):
    """(kernel, Work): the segment realised by codegen at its typical tile (standing for every tile of
    its grid: `typical_index`; `regions`, that tile's box per stage when the caller has them; False: every
    tile, as `generate` builds it) and the kernel IR's count of it — the flops and accesses of the code
    that would print."""
    from engine.codegen.count import count_kernel
    from engine.codegen.generate import build_kernel
    from engine.schedule.plan import Group

    group = Group(0, "segment", tuple(segment), (tile,), "")
    full = {e: conns.get(e, Conn.KERNEL) for p in segment for e in ((p, c) for c in graph.consumers.get(p, ()))}
    kernel = build_kernel(group, graph, full, device, sample=True if regions is None else regions)
    return kernel, count_kernel(kernel)


def segment_regions(graph: PrimGraph, segment: Sequence[str], conns: Mapping, tile: Tile) -> GroupRegions:
    """What one typical (interior) block of the segment computes and reads under `tile`: the regions
    `segment_use` costs, without building the segment's kernel."""
    anchor = graph.stage(tile.stage)
    box = anchor_box(anchor.shape, tile.shape, typical_index(anchor.shape, tile.shape))
    return _regions(graph, segment, conns, tile.stage, box)


def segment_reach(graph: PrimGraph, segment: Sequence[str], conns: Mapping, anchor: str) -> dict[str, int]:
    """Bytes (whole 128 B lines) of each tensor from outside the segment that its whole grid reads at least
    once: the regions read when the anchor's whole output is one box, i.e. the bounding box of every
    block's reads. The other counts take one typical block for all; where blocks read different tensors —
    a concatenation along a tiled axis, whose typical block sits in one arm — its reads times the blocks
    miss the other arms' inputs (zoo decoder_kv on a100: a 196 KB weight read by one arm's blocks only,
    a plan modeled under the DRAM floor). The same for every tile of the segment: one propagation."""
    shape = graph.stage(anchor).shape
    regions = _regions(graph, segment, conns, anchor, anchor_box(shape, shape))
    return {t: read_lines(graph, regions, segment, t, box) * LINE for t, box in regions.inputs.items()}


def _read_lines(graph: PrimGraph, regions: GroupRegions, segment: Sequence[str]) -> dict[str, int]:
    """128 B lines one block reads of each tensor from outside its segment (`read_lines`)."""
    return {t: read_lines(graph, regions, segment, t, box) for t, box in regions.inputs.items()}


def read_lines(graph: PrimGraph, regions: GroupRegions, segment: Sequence[str], tensor: str, box: Box) -> int:
    """128 B lines of `box` of `tensor` a block of `segment` reads (`regions`: that block's). An axis indexed
    through a gathered index (Gather's indices: `index.Indirect`) spans the whole axis in the box, while the
    block reads at most as many positions on it as it reads index values: a 30522 x 768 embedding table read
    by 128 token ids is 128 rows, not the table (bert-base's embedding kernel modeled 5.3 ms of DRAM reads,
    measured 67 us). Each such position is lines of its own (its whole run where the axis is not innermost)."""
    itemsize = graph.specs[tensor].dtype.itemsize
    lines = lines_of(box, itemsize)
    gathered = gathered_axes(graph, segment).get(tensor)
    if not gathered or not box:
        return lines
    capped = list(box)
    for d, sources in gathered.items():
        boxes = [regions.inputs.get(q, regions.stages.get(q)) for q in sources]
        if d >= len(box) or any(b is None for b in boxes):
            continue
        values = sum(box_size(b) if b else 1 for b in boxes)
        lo, hi = box[d]
        capped[d] = (lo, lo + min(hi - lo, values))
    if capped == list(box):
        return lines
    last = len(box) - 1
    if last in gathered:  # scattered elements of the innermost axis: a line each
        return min(lines, box_size(tuple(capped)))
    return min(lines, lines_of(tuple(capped), itemsize))


def gathered_axes(graph: PrimGraph, segment: Sequence[str]) -> dict[str, dict[int, tuple[str, ...]]]:
    """tensor -> {axis: the index tensors it is gathered through} over the loads of `segment`'s stages."""
    def find() -> dict:
        out: dict[str, dict[int, set]] = {}
        for s in segment:
            for node in E.walk(graph.stage(s).body):
                if isinstance(node, E.Load):
                    for d, ix in enumerate(node.index):
                        sources = ix.indirect_tensors()
                        if sources:
                            out.setdefault(node.tensor, {}).setdefault(d, set()).update(sources)
        return {t: {d: tuple(sorted(q)) for d, q in axes.items()} for t, axes in out.items()}

    return memo("cost.gathered_axes", 50000).lookup((graph.structural_hash, tuple(segment)), find)


def _regions(graph: PrimGraph, segment: Sequence[str], conns: Mapping, anchor: str, box: Box) -> GroupRegions:
    # Tile search re-propagates the same (segment, tile shape) for every thread mapping it tries, and a
    # connection trial at REGISTER and one at SHARED the same segment: propagation reads of a connection
    # only whether it keeps the edge inside the segment (`tilegraph.IN_SEGMENT`).
    members = set(segment)
    inner = tuple(conns.get((p, c)) in IN_SEGMENT for p in segment for c in graph.consumers.get(p, ()) if c in members)
    key = (graph.structural_hash, tuple(segment), inner, anchor, box)
    return memo("cost.regions", 50000).lookup(key, lambda: propagate_group(graph, segment, conns, anchor, box))


def _completion_dram(graph: PrimGraph, use: SegmentUse, read_bytes: Mapping[str, int], charged: set) -> int:
    """A stage read outside its segment whose tiles do not cover it is finished by a completion phase
    (the whole tensor, flat, from global memory; its flops and accesses are in the kernel IR's count):
    the part of each outside input the kernel's tiles have not read comes from DRAM, once."""
    seg = set(use.stages)
    d = 0
    for name in use.completion:
        for x in _ancestors_in(graph, seg, name):
            for t in graph.stage(x).inputs:
                if t in seg or t not in graph.specs or t in charged:
                    continue
                charged.add(t)
                d += max(0, nbytes(graph, t) - read_bytes.get(t, 0))
    return d


def _ancestors_in(graph: PrimGraph, members: set[str], name: str) -> list[str]:
    """`name` and every stage of `members` it depends on (what a completion phase inlines)."""
    todo, seen = [name], []
    while todo:
        s = todo.pop()
        if s not in seen:
            seen.append(s)
            todo += [p for p in graph.stage(s).inputs if p in members]
    return seen


def _cold_reads(graph: PrimGraph, members: set[str], uses: Sequence[SegmentUse], read_bytes: Mapping[str, int],
                device: Device, in_llc: bool) -> int:
    """DRAM bytes of a kernel's reads with nothing warm in L2 when it starts (as Nsight Compute replays one
    kernel with `--cache-control all`): its warm figure plus `GroupCost.l2_warm_bytes`."""
    seen: dict[str, int] = {}
    charged: set[str] = set()
    total = 0
    for use in uses:
        total += _read_dram(graph, members, use.read_lines, use.tile.blocks / max(1, use.tile.row_split), device,
                            in_llc, seen, use.reach)
        total += 0 if in_llc else _completion_dram(graph, use, read_bytes, charged)
    return total


# Warps an SM needs to keep its four schedulers' FMA pipes busy (a dependent FMA's ~4-cycle latency hidden
# by two warps each at the ILP of our micro-tiles); shared-memory loads need about half as many.
FMA_WARPS_PER_SM = 8


def latency_efficiency(device: Device, warps_per_sm: float) -> tuple[float, float, float]:
    """(global memory, shared memory, arithmetic) fractions of an SM's peak that `warps_per_sm` resident
    warps can reach on a GPU. Little's law for global memory: bytes in flight = warps x lines in flight x
    128 B, against the SM's share of L2 bandwidth over the load latency. 1.0 each on a CPU or when the
    device gives no latency. Measured on an H200, kernels of one or two warps per SM (1.6-3.1 % achieved
    occupancy) ran 3-55x their modeled time without this (benchmarks/RESULTS.md, first run on a real GPU)."""
    if device.kind == "cpu" or not device.mem_latency_cycles:
        return 1.0, 1.0, 1.0
    per_sm_clk = device.l2_bw_bytes_per_s / device.clock_hz / device.sm_count
    memory = warps_per_sm * device.lines_in_flight_per_warp * LINE / (device.mem_latency_cycles * per_sm_clk)
    return min(1.0, memory), min(1.0, 2 * warps_per_sm / FMA_WARPS_PER_SM), min(1.0, warps_per_sm / FMA_WARPS_PER_SM)


def _bound(terms: Sequence[float], device: Device) -> float:
    """A segment's time from its [dram, l2, shared, compute] terms. A GPU overlaps memory and arithmetic
    across its many resident warps: the busiest resource bounds it. A CPU core runs one block's loops at
    a time: the memory levels it waits on add up, and out-of-order execution hides its arithmetic under
    them (or them under it)."""
    if device.kind == "cpu":
        return max(sum(terms[:3]), terms[3])
    return max(terms)


def _in_llc(graph: PrimGraph, device: Device) -> bool:
    """On a CPU whose last-level cache holds every tensor of the model, kernels read and write that cache,
    not DRAM (a GPU's first touch of a tensor, even one that fits its L2, is counted from DRAM)."""
    return device.kind == "cpu" and graph.total_bytes <= device.l2_bytes


def whole_graph_facts(graph: PrimGraph, device: Device) -> tuple:
    """What a group's cost reads from the graph outside the group (`_in_llc`): memo keys built on a group's
    signature, which sees only the group, carry it, so two models' groups of one structure share a cached
    answer only where they would cost alike."""
    return (_in_llc(graph, device),)


def _read_dram(graph: PrimGraph, members: set[str], read_lines: Mapping[str, int], per_block: float,
               device: Device, in_llc: bool, seen: dict[str, int] | None = None,
               reach: Mapping[str, int] | None = None) -> int:
    """DRAM bytes of one segment's reads from outside it (`per_block`: its blocks over its row split).
    `seen`: bytes of each outside tensor that fits in L2 already charged to this kernel — by its earlier
    segments, or by earlier kernels that left it whole in L2 (`GroupCost.l2_warm`); updated here. A
    re-read within L2's reach is an L2 hit, so a kernel never pays more than a tensor's size for it.
    `reach`: bytes of each tensor the whole grid reads at least (`segment_reach`), a floor under the
    typical block's reads times the blocks."""
    dram = 0
    for tensor, total in grid_reads(read_lines, per_block, reach).items():
        size = nbytes(graph, tensor)
        if tensor in members:  # produced by an earlier segment, behind a grid barrier
            if size > device.l2_bytes:
                dram += total
        elif in_llc:
            pass  # in the last-level cache since the last run
        elif size <= device.l2_bytes:
            done = seen.get(tensor, 0) if seen is not None else 0
            first = min(total, size - done)  # first touch; re-reads hit L2
            dram += first
            if seen is not None:
                seen[tensor] = done + first
        else:
            dram += total
    return dram


def _write_dram(graph: PrimGraph, stages: Sequence[str], conns: Mapping, seg_of: Mapping[str, int],
                device: Device, in_llc: bool) -> tuple[int, dict[int, int]]:
    """(write sectors, DRAM bytes written per segment) of a group: every stage read outside it or
    behind one of its grid barriers is stored once, whatever the tiles."""
    members = seg_of.keys()
    sectors_all, dram = 0, {}
    for name in stages:
        outside = name in graph.outputs or any(c not in members for c in graph.consumers.get(name, ()))
        synced = any(conns.get((name, c)) == Conn.GLOBAL_SYNC and seg_of.get(c) != seg_of[name]
                     for c in graph.consumers.get(name, ()) if c in members)
        if outside or synced:
            size = nbytes(graph, name)
            sectors = -(-size // SECTOR)
            sectors_all += sectors
            if (outside and not in_llc) or size > device.l2_bytes:
                dram[seg_of[name]] = dram.get(seg_of[name], 0) + sectors * SECTOR
    return sectors_all, dram


def _group_writes(graph, stages, conns, seg_of, device: Device, in_llc: bool, local: dict | None):
    """`_write_dram`, once per tile search (`local`: its memo; the writes do not depend on the tiles)."""
    if local is None:
        return _write_dram(graph, stages, conns, seg_of, device, in_llc)
    hit = local.get(("writes",))
    if hit is None:
        hit = local[("writes",)] = _write_dram(graph, stages, conns, seg_of, device, in_llc)
    return hit


def wave_quantisation(device: Device, blocks: int, resident: int) -> float:
    """How much longer a grid of `blocks` takes than its work alone at `resident` blocks per SM. A grid
    smaller than one wave cannot stack more blocks per SM than it has: it is quantised against the slots
    it can fill, so a bigger footprint (fewer resident blocks) never looks cheaper."""
    b = max(1, blocks)
    slots = max(1, resident) * device.sm_count
    fill = min(max(1, resident), -(-b // device.sm_count)) * device.sm_count
    return max(1.0, max(1, -(-b // slots)) * min(slots, fill) / b)


def grid_reads(read_lines: Mapping[str, int], per_block: float, reach: Mapping[str, int] | None = None) -> dict[str, int]:
    """Bytes a segment's whole grid reads of each outside tensor: its typical block's 128 B lines times
    `per_block` (its blocks over its row split), at least its `reach` (`segment_reach`)."""
    reach = reach or {}
    return {t: max(int(read_lines.get(t, 0) * LINE * per_block), reach.get(t, 0)) for t in {**read_lines, **reach}}


def kernel_read_bytes(graph: PrimGraph, uses: Sequence[SegmentUse]) -> dict[str, int]:
    """Per tensor a kernel's segments read from outside them (`uses`, one per segment): `grid_reads` of
    each, summed and capped at the tensor's size."""
    out: dict[str, int] = {}
    for use in uses:
        for t, got in grid_reads(use.read_lines, use.tile.blocks / max(1, use.tile.row_split), use.reach).items():
            out[t] = min(nbytes(graph, t), out.get(t, 0) + got)
    return out


def estimate_group(
    graph: PrimGraph, stages: Sequence[str], conns: Mapping, tiles: Sequence[Tile], device: Device,
    segs: Sequence[Sequence[str]] | None = None, local: dict | None = None, exact: bool = False,
    registers: tuple[int, str] | None = None, warm: Collection[str] = (),
) -> GroupCost:
    """Every term of one kernel's modeled time. `tiles` has one Tile per segment, in segment order
    (`segs`: the group's segments when the caller has them already; `local` and `exact`: see
    `segment_use`). `registers`: (registers per thread, where from) of the compiled kernel, in place of
    the formula's estimate (`at_compiled_registers`). `warm`: tensors earlier kernels of the program left
    whole in L2 (engine/schedule/residency.py; a CPU's last-level cache where the model does not fit it
    whole): this kernel reads them from there, not DRAM."""
    members = set(stages)
    segs = segs if segs is not None else segments_of(graph, stages, conns)
    if len(segs) != len(tiles):
        raise ValueError(f"{len(segs)} segments but {len(tiles)} tiles")
    uses = [segment_use(graph, seg, conns, t, local, exact, device) for seg, t in zip(segs, at_kernel_block(tiles))]
    seg_of = {s: k for k, seg in enumerate(segs) for s in seg}
    n = len(segs)
    # Per segment: segments run one after another (grid barriers), each over its own grid.
    dram, l2, sh, fp32, tc, tc16, tiled, idle, maths = ([0.0] * n for _ in range(9))
    reads = 0
    read_bytes = kernel_read_bytes(graph, uses)
    warm = frozenset(t for t in warm if t in read_bytes and t not in members)
    charged: set[str] = set(warm)  # an input's unread bytes come from DRAM once per kernel
    in_llc = _in_llc(graph, device)
    seen = {t: nbytes(graph, t) for t in warm}  # bytes of each outside input already charged (or in L2)
    for k, use in enumerate(uses):  # reads first: `dram` holds only them until the writes below
        per_block = use.tile.blocks / max(1, use.tile.row_split)
        reads += sum(int(lines * per_block) for lines in use.read_lines.values())
        dram[k] += _read_dram(graph, members, use.read_lines, per_block, device, in_llc, seen, use.reach)
        # Every global load and store the kernel IR counts goes through L2 (DRAM misses included).
        l2[k] += use.global_bytes * per_block
        sh[k] += int(use.shared_traffic * per_block)
        fp32[k] += use.flops_fp32 * per_block
        tiled[k] += use.flops_tiled * per_block
        idle[k] += use.flops_idle_lanes * per_block
        maths[k] += use.flops_math * per_block
        tc[k] += (use.flops_tc - use.flops_tc_f16) * per_block
        tc16[k] += use.flops_tc_f16 * per_block
        dram[k] += 0 if in_llc else _completion_dram(graph, use, read_bytes, charged)
    warm_saved = _cold_reads(graph, members, uses, read_bytes, device, in_llc) - int(sum(dram)) if warm else 0
    flops_once = sum(graph.stage(name).flops for name in stages)
    extra = sum(max(0.0, use.evaluations.get(s, 0.0) * use.tile.blocks / max(1, use.tile.row_split) - graph.stage(s).size)
                for use in uses for s in use.stages)
    writes, written = _group_writes(graph, stages, conns, seg_of, device, in_llc, local)
    for k, b in written.items():
        dram[k] += b
    threads = max(t.threads for t in tiles)
    blocks = max(t.blocks for t in tiles)
    regs = max(u.regs_per_thread for u in uses) if registers is None else registers[0]
    smem = max(u.shared_bytes for u in uses)
    resident, limiter = resident_blocks_per_sm(device, threads, min(regs, device.max_regs_per_thread), smem)
    if regs > device.max_regs_per_thread:
        resident, limiter = 0, f"registers: {regs} per thread exceeds {device.max_regs_per_thread}"
    slots = max(1, resident) * device.sm_count
    waves = max(1, -(-blocks // slots))

    # A CPU runs GEMM / direct-conv micro-tiles near its FMA peak and the rest of the arithmetic (per-element
    # loops) at the rates the host probe measured for generated per-element code: math ops (exp, erf, tanh,
    # div, ...: E.OP_FLOPS) and the flop slots its short vector loops leave idle (`idle_lanes`; 0 on a GPU) at
    # `elementwise_flops`, plain arithmetic at `plain_flops` (several times faster: zoo bert's stitched layer
    # norms modeled 79 µs at the one math rate and measured 11 on a Zen 3, benchmarks/NOTES.md "tworate").
    # Tensor-core flops go at the peak of the instruction printed: m16n8k8 .tf32 at the TF32 peak, m16n8k16 .f16 and .bf16 at the fp16 (fp32-accumulate)
    # peak (the A100/H100 datasheets give BF16 the same dense peak as FP16); an fp16 GEMM the printer left on the FMA micro-tile (a V100, an odd tile) is fp32 FMA work.
    elementwise = device.elementwise_flops or device.peak_fp32_flops
    plain = device.plain_flops or elementwise

    def seg_terms(k: int) -> list[float]:
        # One rate (every GPU preset, device files without plain_flops): the expression as before, so those
        # plans' costs stay bit-identical and their tile choices with them.
        per_element = ((fp32[k] - tiled[k] + idle[k]) / elementwise if plain == elementwise else
                       (maths[k] + idle[k]) / elementwise + (fp32[k] - tiled[k] - maths[k]) / plain)
        compute = (tiled[k] / device.peak_fp32_flops + per_element
                   + (tc[k] / device.peak_tf32_tensor_flops if tc[k] else 0.0)
                   + (tc16[k] / device.peak_fp16_tensor_flops if tc16[k] else 0.0))
        # Warps resident per busy SM: a grid under one wave puts ceil(blocks / SMs) blocks on each.
        t = tiles[k]
        warps = min(max(1, resident), -(-max(1, t.blocks) // device.sm_count)) * max(1, -(-t.threads // device.warp_size))
        glob, shared, arith = latency_efficiency(device, warps)
        return [dram[k] / device.dram_bw_bytes_per_s * 1e6 / glob, l2[k] / device.l2_bw_bytes_per_s * 1e6 / glob,
                sh[k] / device.smem_bw_bytes_per_s * 1e6 / shared, compute * 1e6 / arith]

    busy = quantised = 0.0
    for k, t in enumerate(tiles):
        # A grid smaller than one wave cannot stack more blocks per SM than it has: quantise against
        # the slots it can fill, so a bigger footprint (fewer resident blocks) never looks cheaper.
        # A segment the C target runs serially has its blocks on one core, not spread over sm_count.
        quant = device.sm_count if uses[k].serial else wave_quantisation(device, t.blocks, resident)
        top = _bound(seg_terms(k), device)
        busy += top
        quantised += top * quant
    totals = [sum(x) for x in zip(*(seg_terms(k) for k in range(n)))]
    terms = dict(zip(("dram", "l2", "shared", "compute"), totals))
    busiest = _bound(totals, device)
    # Segments run in turn, each bound by its own busiest resource (equal to `busiest` for one segment).
    terms["segment_serialization"] = busy - busiest
    terms["wave_quantization"] = quantised - busy
    terms["launch"] = device.launch_overhead_s * 1e6
    # A grid barrier is the end of one segment's parallel loop and the start of the next; two serial
    # segments in a row run on the calling thread, one after the other, with none between them.
    barriers = sum(1 for k in range(n - 1) if not (uses[k].serial and uses[k + 1].serial))
    terms["grid_barrier"] = barriers * device.grid_barrier_s * 1e6
    modeled = quantised + terms["launch"] + terms["grid_barrier"]
    quant = quantised / busy if busy else 1.0
    flops = sum(fp32) + sum(tc)
    dram_t, l2_t, sh_t = sum(dram), sum(l2), sum(sh)
    return GroupCost(
        footprint={"register": int(regs), "shared": int(smem)},
        traffic_bytes={"dram": int(dram_t), "l2": int(l2_t), "shared": int(sh_t)},
        transactions={"read_lines": int(reads), "write_sectors": int(writes)},
        flops=int(flops),
        recompute_factor=round(flops / flops_once, 4) if flops_once else 1.0,
        resident_blocks_per_sm=int(resident),
        occupancy_limiter=limiter,
        waves=int(waves),
        wave_efficiency=round(1.0 / quant, 4),
        terms_us={k: round(v, 4) for k, v in terms.items()},
        modeled_us=round(modeled, 4),
        registers_from="formula" if registers is None else registers[1],
        l2_warm=tuple(sorted(warm)),
        l2_warm_bytes=int(warm_saved),
        extra_evaluations=int(round(extra)),
        serial_segments=sum(1 for u in uses if u.serial),
    )


def at_compiled_registers(plan, graph: PrimGraph, device: Device, registers: Mapping[str, int], source: str):
    """`plan` with each group's cost re-estimated at the registers per thread its compiled kernel was
    allotted (`registers`: kernel name -> count, read from the CUBIN NVRTC built for `source`, e.g.
    "sm_90 CUBIN") in place of the formula: occupancy, wave quantisation and the latency terms then
    follow the code as compiled. Groups without a count, and every group on a CPU, keep their cost."""
    if device.kind == "cpu":
        return plan
    conns = {e.key: e.conn for e in plan.edges}
    groups = []
    for g in plan.groups:
        regs = registers.get(g.name)
        if regs is not None and g.cost is not None and (regs, source) != (g.cost.footprint.get("register"),
                                                                          g.cost.registers_from):
            cost = estimate_group(graph, g.stages, conns, g.segments, device, exact=True, registers=(int(regs), source),
                                  warm=g.cost.l2_warm)
            g = dataclasses.replace(g, cost=cost, score=cost.modeled_us)
        groups.append(g)
    return dataclasses.replace(plan, groups=tuple(groups))
