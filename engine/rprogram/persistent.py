"""Persistent-kernel codegen: a Program and its RProgram in, one kernel that walks per-vEU task lists out.

CUDA: each block walks the task lists of the vEUs folded onto it (grid = what one resident wave of the
device holds at the compiled registers, so a block waiting on a dependency counter never waits on a
block that cannot be scheduled); each task runs on the threads it was generated for. C: OpenMP threads
take the rTasks in the same order (start time, then topological), so no thread waits on unstarted work.
Running them: engine/rprogram/persistent_run.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from engine.codegen.ctarget import for_c
from engine.codegen.kir import Kernel, Program, Segment
from engine.codegen.targets import CPrinter, CudaPrinter
from engine.device import Device, wave_grid
from engine.rprogram.model import RProgram, RProgramError, RTask
from engine.rprogram.wavefront import check_rprogram


class _TaskHooks:
    """Turns a one-segment kernel into `name(int task_t, params...)` running tile `task_t` only."""

    def pooled(self, seg: Segment) -> bool:
        return False  # one tile per call, inside the persistent kernel's own OpenMP team

    def tile_loop(self, seg: Segment) -> list[str]:
        return [f"if (task_t < {seg.ntiles}) {{", "    const int t = task_t;"]

    def tile_loop_end(self, seg: Segment, last: bool) -> list[str]:
        return ["}"]

    def panel_phases(self, kernel: Kernel, seg: Segment) -> dict[str, str]:
        return {}  # one tile per call: nothing to keep across tiles

    def leading_params(self, kernel: Kernel) -> list[str]:
        return ["const int task_t"]


class CTaskPrinter(_TaskHooks, CPrinter):
    kernel_prefix = "static "


class CudaTaskPrinter(_TaskHooks, CudaPrinter):
    """A task of `threads` threads inside a persistent block of `block` threads: threads beyond the
    task's own skip its body (its thread mapping, strides and shared buffers were generated for
    `threads`) and its block barriers become a named barrier over the task's warps, so the idle warps
    go straight to the persistent kernel's own barriers around the task. Block buffers sit in the one
    dynamic shared-memory array at the offsets the kernel alone would use."""

    kernel_prefix = "__device__ "

    def __init__(self, block: int) -> None:
        super().__init__()
        self.block = block
        self.threads = block

    def render_kernel(self, kernel: Kernel) -> str:
        if kernel.threads < self.block and kernel.threads % 32:
            raise RProgramError(f"kernel {kernel.name} runs {kernel.threads} threads per block, not whole warps: "
                                f"as a task of a {self.block}-thread persistent block its barriers cannot "
                                "leave the other warps out", hint="use a tile with a multiple of 32 threads")
        self.threads = kernel.threads
        self.block_dim = str(kernel.threads)
        # Barrier 0 is __syncthreads (every thread of the block); named barrier 1 counts the task's warps
        # only (`bar.sync 1, threads`, through the intrinsic so the cuda-sim emulator can run it too).
        self.block_barrier = ("__syncthreads();" if kernel.threads == self.block else
                              f"__barrier_sync_count(1, {kernel.threads});")
        return super().render_kernel(kernel)

    def tile_loop(self, seg: Segment) -> list[str]:
        if self.threads == self.block:
            return super().tile_loop(seg)
        return [f"if (task_t < {seg.ntiles} && threadIdx.x < {self.threads}) {{", "    const int t = task_t;"]

    def kernel_qualifiers(self, kernel: Kernel) -> str:
        return ""  # a __device__ function: the persistent kernel carries the launch bounds


@dataclass(frozen=True)
class PersistentSource:
    """Generated source of the persistent program and the tensor order of its `void** buf` argument.

    CUDA: `grid` is the rProgram's vEU count (what it was placed on), `block` the largest task's threads,
    `shared_bytes` the largest task's dynamic shared memory, `counters` the `done` words it needs."""

    source: str
    entry: str
    tensors: tuple[str, ...]
    grid: int
    block: int
    shared_bytes: int
    counters: int = 0


def _checked(program: Program, rp: RProgram) -> tuple[dict[str, Kernel], dict[str, int]]:
    kernels = {k.name: k for k in program.kernels}
    index = {op.name: j for j, op in enumerate(rp.operators)}
    for op in rp.operators:
        k = kernels.get(op.name)
        if k is None:
            raise RProgramError(f"rOperator {op.name} has no kernel in program {program.name}",
                                hint="build the rProgram from the plan the program was generated from")
        if rp.chosen(op.name).blocks != k.ntiles:
            raise RProgramError(f"rOperator {op.name} runs {rp.chosen(op.name).blocks} blocks but kernel has "
                                f"{k.ntiles} tiles", hint="build the rProgram with variants=False")
    return kernels, index


def task_order(rp: RProgram) -> list[tuple[int, RTask]]:
    """Every (vEU, rTask) in one order that every waiting thread or block follows: by start time, ties by
    the rOperators' topological rank. An rTask's inputs end before it starts, so they come strictly
    earlier; a worker that runs its tasks in this order never waits on a task that cannot progress
    (the earliest unfinished task always can). Refuses an rProgram whose timeline breaks that."""
    problems = check_rprogram(rp)
    if problems:
        raise RProgramError(f"rProgram cannot run as one kernel: {problems[0]}",
                            hint="rebuild it with build_rprogram")
    rank, pending = {}, list(rp.operators)
    while pending:
        ready = [op for op in pending if all(d in rank for d in op.deps)]
        if not ready:
            raise RProgramError("the rOperators' dependencies form a cycle")
        for op in ready:
            rank[op.name] = len(rank)
        pending = [op for op in pending if op.name not in rank]
    tasks = [(v, t) for v, ts in enumerate(rp.veus) for t in ts]
    return sorted(tasks, key=lambda vt: (vt[1].start_us, rank[vt[1].op], vt[1].block, vt[0]))


def persistent_schedule(rp: RProgram, grid: int) -> np.ndarray:
    """The `sched` argument of the CUDA persistent kernel for `grid` blocks (int32): block b runs the
    rTasks of vEUs b, b + grid, ... in `task_order`, so an rProgram placed on more vEUs than the device
    keeps resident is re-placed on fewer blocks without losing its order. Layout: grid + 1 block starts,
    then the tasks' rOperator indices, then their block (tile) indices."""
    if grid <= 0:
        raise RProgramError(f"a persistent kernel needs at least one block, got grid {grid}")
    index = {op.name: j for j, op in enumerate(rp.operators)}
    lists: list[list[RTask]] = [[] for _ in range(min(grid, max(1, rp.vdevice.veus)))]
    for v, t in task_order(rp):
        lists[v % len(lists)].append(t)
    starts = np.cumsum([0] + [len(ts) for ts in lists])
    ops = [index[t.op] for ts in lists for t in ts]
    blocks = [t.block for ts in lists for t in ts]
    return np.ascontiguousarray(np.concatenate([starts, ops, blocks]), dtype=np.int32)


def _tensors(program: Program) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t for ln in program.launches for t in ln.args))


def _task_functions(printer, program: Program, kernels: dict[str, Kernel]) -> tuple[str, dict[str, list[str]]]:
    """One task function per (kernel, segment); returns the source and kernel -> function names."""
    bodies, names = [], {}
    for k in program.kernels:
        names[k.name] = []
        for s, seg in enumerate(k.segments):
            part = dataclasses.replace(k, name=f"{k.name}_s{s}", segments=(seg,))
            bodies.append(printer.render_kernel(part))
            names[k.name].append(part.name)
    # The printer's own rendering: the tensor-core helpers are inline PTX, not HELPERS entries.
    helpers = [printer.render_helper(h) for h in sorted(printer.helpers)]
    return "\n".join([*helpers, "", *bodies]), names


def _call(printer, fn: str, kernel: Kernel, tensors: tuple[str, ...], launch_args: tuple[str, ...],
          tile: str) -> str:
    """`fn(tile, (T*)buf[i], ...)`: the task function of one segment on the tensors the launch binds."""
    written = _written(kernel)
    args = [f"({'' if p.name in written else 'const '}{printer.storage_type(p.dtype)}*)buf[{tensors.index(t)}]"
            for p, t in zip(kernel.params, launch_args)]
    return f"{fn}({', '.join([tile, *args])});"


def _tables(rp: RProgram, index: dict[str, int]) -> dict[str, list[int]]:
    deps_start, deps = [0], []
    for op in rp.operators:
        deps += [index[d] for d in op.deps]
        deps_start.append(len(deps))
    return {"tw_op_blocks": [rp.chosen(op.name).blocks for op in rp.operators], "tw_dep_start": deps_start,
            "tw_deps": deps or [0]}


def _array(printer, name: str, values: list[int]) -> str:
    values = list(values) or [0]
    return f"{printer.table_qualifier} int {name}[{len(values)}] = {{{', '.join(map(str, values))}}};"


def persistent_c(program: Program, rp: RProgram) -> PersistentSource:
    """C: `void tw_persistent(void** buf)` runs every rTask in `task_order` on OpenMP threads."""
    program = for_c(program)
    kernels, index = _checked(program, rp)
    tensors = _tensors(program)
    printer = CTaskPrinter()
    funcs, names = _task_functions(printer, program, kernels)
    order = task_order(rp)
    launch_args = {ln.kernel: ln.args for ln in program.launches}
    cases = []
    for op in rp.operators:
        k = kernels[op.name]
        if len(k.segments) == 1:
            call = _call(printer, names[k.name][0], k, tensors, launch_args[k.name], "b")
            cases.append(f"        case {index[op.name]}: {call} return 1;")
        else:
            # Grid barriers inside one kernel cannot be met by rTasks run one at a time: its first rTask
            # runs every segment over all tiles and counts for all blocks; the others count for none.
            segs = " ".join(f"for (int s = 0; s < {seg.ntiles}; ++s) "
                            f"{_call(printer, fn, k, tensors, launch_args[k.name], 's')}"
                            for seg, fn in zip(k.segments, names[k.name]))
            cases.append(f"        case {index[op.name]}: if (b != 0) return 0; {segs} return {k.ntiles};")
    source = "\n".join([
        printer.header, "#include <stdatomic.h>", funcs,
        _array(printer, "tw_task_op", [index[t.op] for _, t in order]),
        _array(printer, "tw_task_block", [t.block for _, t in order]),
        *(_array(printer, name, values) for name, values in _tables(rp, index).items()),
        "static int tw_run(int op, int b, void** buf) {", "    switch (op) {", *cases, "    }", "    return 0;", "}",
        "void tw_persistent(void** buf) {",
        f"    atomic_int next = 0; atomic_int done[{len(rp.operators)}];",
        f"    for (int j = 0; j < {len(rp.operators)}; ++j) atomic_init(&done[j], 0);",
        # An OpenMP team, not the C header's pool (tw_parallel_for): the threads already claim rTasks one
        # by one (`next`), but a task spin-waits on the dependency counters of tasks other threads claimed,
        # which is the co-scheduling an OpenMP team gives; it waits at the region's end like any team.
        "    #pragma omp parallel",
        "    for (;;) {",
        "        const int i = atomic_fetch_add(&next, 1);",
        f"        if (i >= {len(order)}) break;",
        "        const int op = tw_task_op[i];",
        "        for (int d = tw_dep_start[op]; d < tw_dep_start[op + 1]; ++d)",
        "            while (atomic_load(&done[tw_deps[d]]) < tw_op_blocks[tw_deps[d]]) { }",
        "        atomic_fetch_add(&done[op], tw_run(op, tw_task_block[i], buf));",
        "    }",
        "}",
    ])
    return PersistentSource(source, "tw_persistent", tensors, 0, 0, 0)


def persistent_cuda(program: Program, rp: RProgram) -> PersistentSource:
    """CUDA: `tw_persistent(void** buf, unsigned* done, const int* sched)`, each block walking its list.

    Launch (cooperatively, so the driver refuses rather than deadlocks a grid that is not co-resident)
    with a grid no larger than one resident wave at the compiled registers, `block` threads,
    `shared_bytes` of dynamic shared memory (opted in above 48 KiB), `buf` the device pointers in
    `tensors` order, `done` `counters` zeroed words (the last block to finish zeroes them again for the
    next launch) and `sched` = `persistent_schedule(rp, grid)`. Kernels with grid barriers are refused:
    build the rProgram with the graph, which turns each barrier into a dependency between rOperators."""
    kernels, index = _checked(program, rp)
    coop = [k.name for k in program.kernels if len(k.segments) > 1]
    if coop:
        raise RProgramError(f"kernel {coop[0]} has grid barriers (GLOBAL_SYNC): its blocks cannot be rTasks "
                            "of a persistent kernel", hint="build the rProgram with the graph, which splits "
                            "them into kernels, or connect that edge at KERNEL")
    tensors = _tensors(program)
    threads = max(k.threads for k in program.kernels)
    printer = CudaTaskPrinter(threads)
    funcs, names = _task_functions(printer, program, kernels)
    smem = max(k.shared_bytes for k in program.kernels)
    launch_args = {ln.kernel: ln.args for ln in program.launches}
    cases = [f"        case {index[op.name]}: "
             f"{_call(printer, names[op.name][0], kernels[op.name], tensors, launch_args[op.name], 'b')} break;"
             for op in rp.operators]
    nops = len(rp.operators)
    source = "\n".join([
        printer.header, "extern __shared__ __align__(16) unsigned char tw_smem[];", funcs,
        *(_array(printer, name, values) for name, values in _tables(rp, index).items()),
        f'extern "C" __global__ void __launch_bounds__({threads}) '
        "tw_persistent(void** buf, unsigned* done, const int* sched) {",
        "    // sched: gridDim.x + 1 list starts, then each task's rOperator, then its tile",
        "    const int* ops = sched + gridDim.x + 1;",
        "    const int* tiles = ops + sched[gridDim.x];",
        "    for (int i = sched[blockIdx.x]; i < sched[blockIdx.x + 1]; ++i) {",
        "        const int op = ops[i], b = tiles[i];",
        "        if (threadIdx.x == 0)",
        "            for (int d = tw_dep_start[op]; d < tw_dep_start[op + 1]; ++d)",
        "                while (atomicAdd(&done[tw_deps[d]], 0u) < (unsigned)tw_op_blocks[tw_deps[d]]) { }",
        "        __threadfence();",
        "        __syncthreads();",
        "        switch (op) {", *cases, "        }",
        "        __syncthreads();  // every thread's stores precede the counter update",
        "        if (threadIdx.x == 0) { __threadfence(); atomicAdd(&done[op], 1u); }",
        "    }",
        "    // The last block out zeroes the counters, so the next launch needs no memset.",
        "    if (threadIdx.x == 0) {",
        "        __threadfence();",
        f"        if (atomicAdd(&done[{nops}], 1u) == gridDim.x - 1) {{",
        f"            for (int j = 0; j <= {nops}; ++j) done[j] = 0u;",
        "            __threadfence();",
        "        }",
        "    }",
        "}",
    ])
    return PersistentSource(source, "tw_persistent", tensors, rp.vdevice.veus, threads, smem, nops + 1)


def _written(k: Kernel) -> set[str]:
    return {n for s in k.segments for p in s.phases for n in p.stores}


def compile_persistent_cuda(program: Program, rp: RProgram, arch: str = "sm_80"):
    """NVRTC-compile the persistent kernel (no GPU needed); returns (PersistentSource, CudaBinary)."""
    from engine.codegen.nvrtc import compile_cuda

    src = persistent_cuda(program, rp)
    return src, compile_cuda(src.source, name=f"{program.name}_persistent", arch=arch)


def modeled_grid(src: PersistentSource, binary, device: Device) -> tuple[int, str]:
    """Blocks of the persistent kernel one wave of `device` holds at the registers NVRTC compiled it to
    (modeled from the device's figures: what `run_persistent_cuda` gets from the driver on a GPU), and
    why. 0 when a block cannot be resident at all."""
    used = binary.resources(src.entry)
    return wave_grid(device, src.grid, src.block, used.registers, src.shared_bytes + used.static_shared_bytes)
