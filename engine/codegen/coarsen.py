"""Block coarsening for the C target: on a CPU a block is one iteration of an OpenMP loop, so a plan
whose convolution tiles hold one output channel per block restages the same input window once per
channel and runs a micro-kernel that can reuse each loaded input value for one channel only. Here
neighbouring blocks along the output-channel axis are merged into one (the tile widened along that
axis), as GPU-to-CPU translators coarsen blocks: the window is staged once for `CHANNELS` output
channels and the C convolution's micro-kernel keeps several channels' partial sums in registers.

The coarsened plan is still a plan `validate` accepts for the device (a tile that is not is left as
it was), so it is checked by the same rules; only the grid of the C program differs from the CUDA
program of the same plan. A Plan in, a Plan out; it depends on the plan and on this host's thread
count (min_tiles), like the rest of the C build (-march=native)."""

from __future__ import annotations

import dataclasses
import os

from engine.codegen.count import count_kernel
from engine.device import Device
from engine.ir.graph import PrimGraph
from engine.schedule.plan import Group, Plan, Tile
from engine.schedule.tiles import tile_counts
from engine.schedule.validate import check_group

CHANNELS = 16  # output channels per coarsened block, at most (micro-tiles take up to 8 at a time)
# A segment of at least ROW_BLOCKS blocks per OpenMP thread is coarsened along its most-split axis.
ROW_BLOCKS = 4


def min_tiles() -> int:
    """Blocks a coarsened segment keeps (where it had them): one per OpenMP thread of this host. More
    blocks restage the same window more often (a block's window holds every input channel); fewer
    leave a thread idle. Measured on conv_bn_relu (two threads, same process, min of 9 batches): one
    block per thread 168-170 us, two per thread 192-198 us; mobilenetv2_block unchanged (~800 us).
    Earlier, before the vector micro-tiles: 16 channels / 4 blocks 200 us, 8 / 8 233 us."""

    threads = os.environ.get("OMP_NUM_THREADS", "").split(",")[0]
    n = int(threads) if threads.isdigit() and int(threads) > 0 else (os.cpu_count() or 1)
    return n


def coarsen_for_c(plan: Plan, graph: PrimGraph, device: Device, built_out: dict | None = None,
                  keep: set[str] = frozenset()) -> Plan:
    """`plan` with each segment that holds a dense convolution of fewer than CHANNELS output channels
    per block widened along its anchor's channel axis (axis 1 of a rank-4 NCHW anchor), and each
    segment of dot products against a weight (a GEMM of at most GEMV_ROWS rows: lstm's h @ R^T)
    widened along its columns to one block per thread, where the widened group still validates and
    the convolution's channels / the GEMM's columns per block actually grow; and each segment of at
    least ROW_BLOCKS blocks per thread made taller along its most-split axis where the kernel IR counts
    no more flops and keeps its GEMM / conv phases (rules in `_rules`, first accepted wins).
    `built_out` (group name -> Kernel) receives each group's kernel at its final tiles, so the caller
    need not build it again. Segments anchored in `keep` stay as they are."""
    from engine.codegen.generate import build_kernel

    conns = {e.key: e.conn for e in plan.edges}
    threads = device.sm_count if device.kind == "cpu" else min_tiles()
    groups = []
    for group in plan.groups:
        kernel = build_kernel(group, graph, conns, device)
        by_anchor = {t.stage: t for t in group.segments}
        tiles = list(group.segments)
        for seg in kernel.segments:
            tile = by_anchor.get(seg.anchor)
            if tile is None or seg.anchor in keep:
                continue
            k = tiles.index(tile)
            for options, accept in _rules(graph, seg, tile, kernel, threads):
                found = None
                for wider in options:
                    trial = tiles[:k] + [wider] + tiles[k + 1:]
                    if check_group(graph, group.stages, conns, trial, device, group.name):
                        continue
                    built = build_kernel(dataclasses.replace(group, segments=tuple(trial)), graph, conns, device)
                    grown = next((s for s in built.segments if s.anchor == seg.anchor), None)
                    if grown is not None and accept(grown, built) \
                            and built.shared_bytes <= device.max_smem_per_block_bytes:
                        found = trial, built
                        break
                if found:
                    tiles, kernel = found
                    break
        groups.append(group if tiles == list(group.segments) else _with_tiles(group, tiles))
        if built_out is not None:
            built_out[group.name] = kernel
    return dataclasses.replace(plan, groups=tuple(groups))


def _rules(graph: PrimGraph, seg, tile: Tile, kernel, threads: int) -> list:
    """(candidate tiles, accept(grown segment, built kernel)) per coarsening that applies to `seg`, in
    order of preference; the first rule with an accepted candidate wins. `threads`: the OpenMP threads
    the blocks are spread over."""
    rules = []
    chans, cols = _dense_conv_channels(seg), _gemv_cols(seg)
    if chans is not None and chans < CHANNELS and len(tile.shape) == 4:
        rules.append((_wider(graph, tile, 1, -(-CHANNELS // chans), threads),
                      lambda grown, built: (_dense_conv_channels(grown) or 0) > chans))
    if cols is not None and seg.ntiles > threads:
        # Dot products streaming a weight (split statically by the C printer): one block per
        # thread, so each thread recomputes the row the products read once, not per block.
        rules.append((_wider(graph, tile, len(tile.shape) - 1, seg.ntiles // threads, threads),
                      lambda grown, built: (_gemv_cols(grown) or 0) > cols))
    axis = _most_tiled_axis(graph, tile)
    if seg.ntiles >= ROW_BLOCKS * threads and axis is not None:
        # Many small blocks (a GPU's grid): fewer, taller ones along the axis with the most tiles,
        # where that does not add work (a stencil's halo is recomputed per block, so taller blocks
        # recompute less; a GEMM's weight is read once per block) — see ROW_BLOCKS.
        rules.append((_wider(graph, tile, axis, seg.ntiles // threads, threads),
                      _no_more_work(-count_kernel(kernel).flops, _tiled_phases(seg))))
    return rules


def _no_more_work(have: float, tiled: int):
    def grows(seg, built) -> bool:
        """The widened kernel counts no more flops than before (`have` is minus the old count; a halo
        recomputed per block shrinks) and the segment keeps its `tiled` GEMM / direct conv phases: a
        region too large for them falls back to per-element loops (mobilevit's expand + depthwise
        segment: 14x slower; without this check convnext unfused went 0.30 -> 0.77 ms). Taller GEMM
        blocks read each weight panel for more rows (bert's welder MLP: 2-row tiles, 64 of them, streamed
        every weight 64 times; welder/unfused 1.94 -> 1.16)."""
        return _tiled_phases(seg) >= tiled and -count_kernel(built).flops >= have
    return grows


def _tiled_phases(seg) -> int:
    return sum(p.gemm is not None or p.conv is not None for p in seg.phases)


def _most_tiled_axis(graph: PrimGraph, tile: Tile) -> int | None:
    """The anchor axis split into the most tiles (rows of an image or of a token matrix), or None."""
    anchor = graph.stage(tile.stage)
    counts = [-(-n // t) for n, t in zip(anchor.shape, tile.shape)]
    if not counts:  # a rank-0 anchor: one block
        return None
    axis = max(range(len(counts)), key=lambda a: (counts[a], a))
    return axis if counts[axis] > 1 else None


def _dense_conv_channels(seg) -> int | None:
    """Output channels per block of the segment's first dense (not depthwise) convolution, or None."""
    convs = [p.conv for p in seg.phases if p.conv is not None and not p.conv.depthwise]
    return convs[0].out[0] if convs else None


def _gemv_cols(seg) -> int | None:
    """Columns per block of the segment's tiled GEMM of at most GEMV_ROWS rows (the C printer runs it
    as dot products against a weight, its tiles split statically over the threads), or None."""
    from engine.codegen.ctarget import GEMV_ROWS

    gemms = [p.gemm for p in seg.phases if p.gemm is not None]
    return gemms[0].bn if gemms and gemms[0].bm <= GEMV_ROWS and len(gemms) == 1 else None


def _wider(graph: PrimGraph, tile: Tile, axis: int, factor: int, threads: int) -> list[Tile]:
    """Candidate tiles, widest first: the anchor's `axis` (the channel axis of an NCHW anchor, or the
    last axis) multiplied by `factor`, then by halves of it, keeping a block per thread where the plan
    had that many."""
    anchor = graph.stage(tile.stage)
    if tile.shape[axis] >= anchor.shape[axis]:
        return []
    out, least = [], threads
    while factor >= 2:
        shape = list(tile.shape)
        shape[axis] = min(anchor.shape[axis], tile.shape[axis] * factor)
        blocks = tile_counts(anchor.shape, tuple(shape)) * tile.row_split
        if blocks >= min(least, tile.blocks):
            # a wider tile takes the default thread mapping of its own shape (the plan records it again)
            out.append(dataclasses.replace(tile, shape=tuple(shape), blocks=blocks, thread_shape=()))
        factor //= 2
    return out


def _with_tiles(group: Group, tiles: list[Tile]) -> Group:
    return dataclasses.replace(group, segments=tuple(tiles), cost=None, candidates=(),
                               reason=group.reason + "; C target: blocks coarsened (fewer, larger: a CPU block is an OpenMP iteration)")
