"""Compile a Program for a target. CUDA: one translation unit per kernel (the prelude, the helpers it
uses and the kernel) compiled with NVRTC to PTX + CUBIN per arch; C: one shared library through the
system compiler. Also the files and the program.json that `tileweave compile` and the bundle write."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from engine.codegen.generate import TARGETS
from engine.codegen.kir import Program, program_to_json
from engine.codegen.targets import render_c, render_cuda
from engine.errors import CompileError, TileweaveError
from engine.limits import call_bounded

COMPILE_TARGETS = (*TARGETS, "opencl")  # opencl: the CUDA program's kernels printed as OpenCL C
EXTENSIONS = {"cuda": "cu", "c": "c", "opencl": "cl"}


@dataclass(frozen=True)
class CompiledKernel:
    """One kernel's CUDA translation unit and its binaries, one per arch of the program."""

    name: str
    source: str
    binaries: tuple  # tuple[CudaBinary, ...] in CompiledProgram.archs order


@dataclass(frozen=True)
class CompiledProgram:
    target: str
    source: str  # the whole program (CUDA: every kernel in one file, for reading)
    archs: tuple[str, ...] = ()  # cuda only
    kernels: tuple[CompiledKernel, ...] = ()  # cuda only, in Program.kernels order
    library: str = ""  # c only: path of the shared library

    @property
    def arch(self) -> str:
        """The first (primary) arch; "" for C."""
        return self.archs[0] if self.archs else ""


def kernel_units(program: Program) -> tuple[tuple[str, str], ...]:
    """(kernel name, CUDA source of that kernel alone) per kernel: the same printer over a program
    holding only that kernel, so the unit carries the prelude and exactly the helpers it calls."""
    return tuple((k.name, render_cuda(dataclasses.replace(program, kernels=(k,)))) for k in program.kernels)


def compile_program(program: Program, target: str, *, arch: str = "sm_80",
                    archs: tuple[str, ...] | None = None, time_limit: float | None = None) -> CompiledProgram:
    """Render and compile `program` for `target`: "cuda" for every arch in `archs` (default: `arch`),
    each kernel on its own through the NVRTC disk cache; or "c". `time_limit` (seconds) bounds the whole
    compile: NVRTC runs in-process, so with a limit it runs in a worker process that is killed when the
    time is up (engine/limits.py:call_bounded); the C compiler is a process of its own already."""
    if target == "cuda" and time_limit is not None:
        return call_bounded(compile_program, program, target, arch=arch, archs=archs, seconds=time_limit,
                            what=f"the NVRTC compile of {program.name}")
    if target == "cuda":
        from engine.codegen.nvrtc import compile_cuda

        archs = tuple(archs or (arch,))
        kernels = tuple(CompiledKernel(name, unit, tuple(compile_cuda(unit, name=name, arch=a) for a in archs))
                        for name, unit in kernel_units(program))
        return CompiledProgram("cuda", render_cuda(program), archs, kernels)
    if target == "c":
        from engine.codegen.ccompile import compile_c

        source = render_c(program)
        return CompiledProgram("c", source, library=str(compile_c(source, name=program.name, timeout=time_limit)))
    if target == "opencl":  # built for the first OpenCL device: the build is the check
        from engine.runtime.opencl import build_opencl

        return CompiledProgram("opencl", build_opencl(program)[4])
    raise CompileError(f"unknown target '{target}' (choose one of {', '.join(COMPILE_TARGETS)})")


def compiled_registers(compiled: CompiledProgram, arch: str) -> dict[str, int]:
    """Kernel name -> registers per thread NVRTC allotted it for `arch` (read from the CUBIN, no GPU
    needed); empty when the program was not compiled for `arch` (or is not CUDA)."""
    if arch not in compiled.archs:
        return {}
    at = compiled.archs.index(arch)
    return {k.name: k.binaries[at].resources(k.name).registers for k in compiled.kernels}


def at_compiled(plan, graph, device, compiled: CompiledProgram):
    """`plan` costed at the registers its kernels were compiled to for `device`'s arch (the cost model's
    formula stands where there is no such CUBIN): `cost.at_compiled_registers`."""
    from engine.schedule.cost import at_compiled_registers

    regs = compiled_registers(compiled, device.nvrtc_arch)
    return at_compiled_registers(plan, graph, device, regs, f"{device.nvrtc_arch} CUBIN") if regs else plan


def fit_launches(program: Program, compiled: CompiledProgram, device) -> Program:
    """`program` with each cooperative launch's grid re-capped to one wave of `device` at the registers
    its kernel was compiled to (the first arch's CUBIN): modeled, since no GPU need be attached. The
    CUDA launcher caps it again with the attached device's own occupancy."""
    from engine.device import wave_grid

    if compiled.target != "cuda":
        return program
    kernels = {k.name: k for k in program.kernels}
    binaries = {k.name: k.binaries[0] for k in compiled.kernels}
    launches = []
    for ln in program.launches:
        k = kernels[ln.kernel]
        if ln.cooperative:
            used = binaries[k.name].resources(k.name)  # the grid barrier itself may take static shared memory
            grid, why = wave_grid(device, k.ntiles, k.threads, used.registers,
                                  k.shared_bytes + used.static_shared_bytes)
            if grid == 0:
                raise CompileError(f"kernel {k.name} as compiled cannot be resident on {device.name}: {why}",
                                   hint="use a smaller tile or connect its GLOBAL_SYNC edges at KERNEL")
            ln = dataclasses.replace(ln, grid=grid)
        launches.append(ln)
    return dataclasses.replace(program, launches=tuple(launches))


def compiled_files(program: Program, compiled: CompiledProgram) -> dict[str, bytes]:
    """File name -> bytes: the program source (NAME.cu or NAME.c) and, for CUDA, per kernel
    KERNEL.cu, KERNEL.ARCH.ptx and KERNEL.ARCH.cubin."""
    ext = EXTENSIONS[compiled.target]
    files = {f"{program.name}.{ext}": compiled.source.encode()}
    for k in compiled.kernels:
        if f"{k.name}.cu" in files:
            raise CompileError(f"kernel {k.name} has the program's name; its files would overwrite the program's")
        files[f"{k.name}.cu"] = k.source.encode()
        for binary in k.binaries:
            files[f"{k.name}.{binary.arch}.ptx"] = binary.ptx.encode()
            files[f"{k.name}.{binary.arch}.cubin"] = binary.cubin
    return files


def program_json(program: Program, compiled: CompiledProgram, files: dict[str, bytes], prefix: str = "") -> dict:
    """program.json: `program_to_json` (kernels, launches, memory, ...) plus the target, archs, every
    kernel's and launch's source/PTX/CUBIN files with sha256 (names as in `files`, under `prefix`),
    and `buffers` (every tensor a kernel touches: role, bytes, arena offset)."""
    def entry(name: str) -> dict:
        return {"file": prefix + name, "sha256": hashlib.sha256(files[name]).hexdigest()}

    meta = program_to_json(program)
    ext = EXTENSIONS[compiled.target]
    per_kernel = {}
    for k in compiled.kernels:
        per_kernel[k.name] = {
            "source": entry(f"{k.name}.cu"),
            "binaries": {b.arch: {"ptx": entry(f"{k.name}.{b.arch}.ptx"), "cubin": entry(f"{k.name}.{b.arch}.cubin")}
                         for b in k.binaries},
            # What NVRTC allotted per arch (registers, local and static shared bytes), from each CUBIN.
            "resources": {b.arch: b.resources(k.name).to_json() for b in k.binaries},
        }
    for item in meta["kernels"] + meta["launches"]:
        item.update(per_kernel.get(item.get("kernel", item.get("name")), {}))
    for item in meta["launches"]:  # a cooperative kernel's blocks loop over its tiles: any grid up to this
        item["tiles"] = program.kernel(item["kernel"]).ntiles
        item["grid_source"] = (f"modeled: one resident wave of {program.device} (fit_launches: at the compiled "
                               "registers); on a GPU the launcher re-caps it by the driver's occupancy"
                               if item["cooperative"] else "one block per tile")
    meta |= {"target": compiled.target, "arch": compiled.arch, "archs": list(compiled.archs),
             "source": prefix + f"{program.name}.{ext}", "buffers": _buffers(program)}
    if compiled.kernels:
        first = compiled.kernels[0].binaries[0]
        meta |= {"nvrtc": ".".join(map(str, first.nvrtc_version)), "nvrtc_options": list(first.options)}
    return meta


def _buffers(program: Program) -> list[dict]:
    """Every global tensor in first-use order; intermediates carry their arena offset (memory.arena_bytes
    is the peak, memory.naive_bytes the sum of one buffer each), the rest are allocated on their own."""
    offsets = {a.tensor: a.offset for a in program.memory.allocations}
    roles = {**{t: "intermediate" for t in offsets}, **{t: "input" for t in program.inputs},
             **{t: "constant" for t in program.constants}, **{t: "output" for t in program.outputs}}
    seen: dict[str, dict] = {}
    for k in program.kernels:
        for b in k.params:
            seen.setdefault(b.tensor, {"tensor": b.tensor, "role": roles.get(b.tensor, "intermediate"),
                                       "dtype": b.dtype.value, "shape": list(b.shape), "nbytes": b.nbytes,
                                       "offset": offsets.get(b.tensor)})
    return list(seen.values())


def write_compiled(program: Program, compiled: CompiledProgram, out: Path) -> list[Path]:
    """Write `compiled_files` and program.json into `out` (created); returns the paths written.
    A folder that cannot be written, or one holding a file of the same name that an earlier compile did
    not write (no program.json there), is a one-line TileweaveError."""
    files = compiled_files(program, compiled)
    meta = program_json(program, compiled, files)
    files["program.json"] = json.dumps(meta, indent=1).encode()
    clash = sorted(name for name in files if (out / name).exists())
    if clash and not (out / "program.json").is_file():  # a folder of the user's, not an earlier compile
        raise TileweaveError(f"'{out}' already has {clash[0]} and is not an earlier tileweave compile output "
                             "(no program.json): writing would replace it", hint="choose another -o folder")
    written = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (out / name).write_bytes(data)
            written.append(out / name)
    except OSError as err:
        raise TileweaveError(f"cannot write into '{out}' ({err.strerror or err})",
                             hint="choose another -o folder") from None
    return written
