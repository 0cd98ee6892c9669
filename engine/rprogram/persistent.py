"""Persistent-kernel codegen: a Program and its RProgram in, one kernel that walks per-vEU task lists out.

CUDA: one block per vEU (the grid is the vDevice, one resident wave, so a block waiting on a dependency
counter never waits on a block that cannot be scheduled). C: OpenMP threads take the rTasks in start-time
order (a valid topological order) and wait on the same counters, so no thread waits on unstarted work."""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from engine.codegen.kir import Kernel, Program, Segment
from engine.codegen.targets import CPrinter, CudaPrinter
from engine.ir.graph import PrimGraph
from engine.rprogram.model import RProgram, RProgramError


class _TaskHooks:
    """Turns a one-segment kernel into `void name(int task_t, params...)` running tile `task_t` only."""

    def tile_loop(self, seg: Segment) -> list[str]:
        return [f"if (task_t < {seg.ntiles}) {{", "    const int t = task_t;"]

    def tile_loop_end(self, seg: Segment, last: bool) -> list[str]:
        return ["}"]

    def panel_phases(self, kernel: Kernel, seg: Segment) -> dict[str, str]:
        return {}  # one tile per call: nothing to keep across tiles

    def signature(self, kernel: Kernel) -> str:
        sig = super().signature(kernel)  # type: ignore[misc]
        return sig.replace(f"{kernel.name}(", f"{kernel.name}(int task_t, ", 1)


class CTaskPrinter(_TaskHooks, CPrinter):
    kernel_prefix = "static "


class CudaTaskPrinter(_TaskHooks, CudaPrinter):
    """Block buffers live in the one dynamic shared-memory array of the persistent kernel (static
    `__shared__` arrays of every task function would add up instead of overlapping)."""

    kernel_prefix = "__device__ "

    def __init__(self) -> None:
        super().__init__()
        self._offset = 0

    def render_kernel(self, kernel: Kernel) -> str:
        self._offset = 0
        return super().render_kernel(kernel)

    def local_decl(self, buf) -> str:
        ctype = self.storage_type(buf.dtype)
        line = f"{ctype}* {buf.name} = ({ctype}*)(tw_smem + {self._offset});"
        self._offset += -(-buf.capacity * buf.dtype.itemsize // 16) * 16
        return line

    def signature(self, kernel: Kernel) -> str:
        return super().signature(kernel).replace(f" __launch_bounds__({kernel.threads})", "")


@dataclass(frozen=True)
class PersistentSource:
    """Generated source of the persistent program and the tensor order of its `void** buffers` argument."""

    source: str
    entry: str
    tensors: tuple[str, ...]
    grid: int
    block: int
    shared_bytes: int


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
    helpers = [f"{printer.helper_prefix} {h}" for h in _helpers(printer)]
    return "\n".join([*helpers, "", *bodies]), names


def _helpers(printer) -> list[str]:
    from engine.codegen.printer import HELPERS

    return [HELPERS[h] for h in sorted(printer.helpers)]


def _call(fn: str, kernel: Kernel, tensors: tuple[str, ...], launch_args: tuple[str, ...], block: str,
          cast) -> str:
    args = [cast(p, f"buf[{tensors.index(t)}]") for p, t in zip(kernel.params, launch_args)]
    return f"{fn}({block}, {', '.join(args)});"


def _tables(rp: RProgram, index: dict[str, int]) -> dict[str, list[int]]:
    deps_start, deps = [0], []
    for op in rp.operators:
        deps += [index[d] for d in op.deps]
        deps_start.append(len(deps))
    return {"op_blocks": [rp.chosen(op.name).blocks for op in rp.operators], "dep_start": deps_start,
            "deps": deps or [0]}


def _array(ctype: str, name: str, values: list[int]) -> str:
    return f"static const {ctype} {name}[{max(1, len(values))}] = {{{', '.join(map(str, values or [0]))}}};"


def persistent_c(program: Program, rp: RProgram) -> PersistentSource:
    """C: `void tw_persistent(void** buf)` runs every rTask in start-time order on OpenMP threads."""
    kernels, index = _checked(program, rp)
    tensors = _tensors(program)
    printer = CTaskPrinter()
    funcs, names = _task_functions(printer, program, kernels)
    order = sorted(((t.start_us, v, t.op, t.block) for v, ts in enumerate(rp.veus) for t in ts))
    tab = _tables(rp, index)
    launch_args = {ln.kernel: ln.args for ln in program.launches}
    cases = []
    for op in rp.operators:
        k = kernels[op.name]
        calls = [_call(fn, k, tensors, launch_args[k.name], "b", lambda p, x: x) for fn in names[k.name]]
        if len(calls) == 1:
            cases.append(f"        case {index[op.name]}: {calls[0]} return 1;")
        else:
            # Grid barriers inside one kernel cannot be met by rTasks run one at a time: its first rTask
            # runs every segment over all tiles and counts for all blocks; the others count for none.
            segs = " ".join(f"for (int s = 0; s < {seg.ntiles}; ++s) {c.replace('(b,', '(s,', 1)}"
                            for seg, c in zip(k.segments, calls))
            cases.append(f"        case {index[op.name]}: if (b != 0) return 0; {segs} return {k.ntiles};")
    source = "\n".join([
        printer.header, "#include <stdatomic.h>", funcs,
        _array("int", "tw_task_op", [index[o] for _, _, o, _ in order]),
        _array("int", "tw_task_block", [b for _, _, _, b in order]),
        _array("int", "tw_op_blocks", tab["op_blocks"]), _array("int", "tw_dep_start", tab["dep_start"]),
        _array("int", "tw_deps", tab["deps"]),
        "static int tw_run(int op, int b, void** buf) {", "    switch (op) {", *cases, "    }", "    return 0;", "}",
        "void tw_persistent(void** buf) {",
        f"    atomic_int next = 0; atomic_int done[{len(rp.operators)}];",
        f"    for (int j = 0; j < {len(rp.operators)}; ++j) atomic_init(&done[j], 0);",
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
    """CUDA: `tw_persistent(void** buf, unsigned* done)`, one block per vEU walking its task list.

    Launch with `grid` blocks of `block` threads, `shared_bytes` of dynamic shared memory (above 48 KiB
    set cudaFuncAttributeMaxDynamicSharedMemorySize), `buf` the device pointers in `tensors` order and
    `done` one zeroed counter per rOperator. Kernels with grid barriers are refused."""
    kernels, index = _checked(program, rp)
    coop = [k.name for k in program.kernels if len(k.segments) > 1]
    if coop:
        raise RProgramError(f"kernel {coop[0]} has grid barriers (GLOBAL_SYNC): its blocks cannot be rTasks "
                            "of a persistent kernel", hint="connect that edge at KERNEL, or run it apart")
    tensors = _tensors(program)
    printer = CudaTaskPrinter()
    funcs, names = _task_functions(printer, program, kernels)
    tab = _tables(rp, index)
    launch_args = {ln.kernel: ln.args for ln in program.launches}
    starts, ops, blocks = [0], [], []
    for ts in rp.veus:
        ops += [index[t.op] for t in ts]
        blocks += [t.block for t in ts]
        starts.append(len(ops))
    threads = max(k.threads for k in program.kernels)
    smem = max(k.shared_bytes for k in program.kernels)
    cases = []
    for op in rp.operators:
        k = kernels[op.name]
        call = _call(names[k.name][0], k, tensors, launch_args[k.name], "b",
                     lambda p, x, k=k: f"({'' if p.name in _written(k) else 'const '}"
                                       f"{printer.storage_type(p.dtype)}*){x}")
        cases.append(f"        case {index[op.name]}: {call} break;")
    arr = lambda c, n, v: _array(c, n, v).replace("static const", "__device__ const")  # noqa: E731
    source = "\n".join([
        printer.header, "extern __shared__ __align__(16) unsigned char tw_smem[];", funcs,
        arr("int", "tw_veu_start", starts), arr("int", "tw_task_op", ops), arr("int", "tw_task_block", blocks),
        arr("int", "tw_op_blocks", tab["op_blocks"]), arr("int", "tw_dep_start", tab["dep_start"]),
        arr("int", "tw_deps", tab["deps"]),
        f'extern "C" __global__ void __launch_bounds__({threads}) tw_persistent(void** buf, unsigned* done) {{',
        "    for (int i = tw_veu_start[blockIdx.x]; i < tw_veu_start[blockIdx.x + 1]; ++i) {",
        "        const int op = tw_task_op[i], b = tw_task_block[i];",
        "        if (threadIdx.x == 0)",
        "            for (int d = tw_dep_start[op]; d < tw_dep_start[op + 1]; ++d)",
        "                while (atomicAdd(&done[tw_deps[d]], 0u) < (unsigned)tw_op_blocks[tw_deps[d]]) { }",
        "        __threadfence();",
        "        __syncthreads();",
        "        switch (op) {", *cases, "        }",
        "        __syncthreads();  // every thread's stores precede the counter update",
        "        if (threadIdx.x == 0) { __threadfence(); atomicAdd(&done[op], 1u); }",
        "    }",
        "}",
    ])
    return PersistentSource(source, "tw_persistent", tensors, rp.vdevice.veus, threads, smem)


def _written(k: Kernel) -> set[str]:
    return {n for s in k.segments for p in s.phases for n in p.stores}


def compile_persistent_cuda(program: Program, rp: RProgram, arch: str = "sm_80"):
    """NVRTC-compile the persistent kernel (no GPU needed); returns (PersistentSource, CudaBinary)."""
    from engine.codegen.nvrtc import compile_cuda

    src = persistent_cuda(program, rp)
    return src, compile_cuda(src.source, name=f"{program.name}_persistent", arch=arch)


def run_persistent_c(program: Program, rp: RProgram, graph: PrimGraph,
                     inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Compile and run the persistent program on the CPU; outputs by ONNX output name.

    Every tensor gets its own buffer: the Program's arena reuses memory by liveness over the launch
    order, which rTasks of different kernels running side by side do not follow."""
    from engine.codegen.ccompile import compile_c, load_library
    from engine.runtime.cpu import bind_buffers

    src = persistent_c(program, rp)
    lib = load_library(compile_c(src.source, name=f"{program.name}_persistent"))
    bound = bind_buffers(dataclasses.replace(program, memory=dataclasses.replace(program.memory, allocations=())),
                         graph.specs, inputs, graph.weights)
    env = {t: bound[t] if t in bound else np.empty(graph.specs[t].shape, graph.specs[t].dtype.np)
           for t in src.tensors}
    ptrs = (ctypes.c_void_p * len(src.tensors))(*[env[t].ctypes.data for t in src.tensors])
    fn = lib.tw_persistent
    fn.restype, fn.argtypes = None, [ctypes.c_void_p]
    fn(ptrs)
    return {name: env[t].copy() for name, t in zip(program.output_names, program.outputs)}
