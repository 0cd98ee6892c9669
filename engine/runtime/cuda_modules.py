"""program.json + a file reader + a Gpu (engine/runtime/cuda_launch.py) in; one loaded module per kernel,
the launch rules, and the launch list run with device buffers and timed, out.

Shared by the CUDA executor (engine/runtime/cuda.py) and the bundle's standalone run_bundle.py, which
embeds the code below this docstring verbatim: keep it standard library + NumPy, with no engine imports.
Launch rules: dynamic shared memory opted in above 48 KiB; kernels with grid barriers launched
cooperatively, their grid capped at one resident wave of the *attached* device (the driver's occupancy
for the compiled registers and shared bytes), never a preset's guess.
"""

import hashlib

import numpy as np


class LoadError(Exception):
    """A kernel has no binary this GPU can load, a file does not match its hash, or a launch cannot be made."""


def arch_number(arch):
    """The number of an arch name: 90 for sm_90 and sm_90a."""
    return int(arch[3:].rstrip("af"))


def choose_binary(binaries, arch):
    """("cubin", arch) when the kernel has a CUBIN built for exactly `arch` (e.g. "sm_86"), else
    ("ptx", A) for the newest plain A <= arch: the driver JIT-compiles PTX forward, never back."""
    if arch in binaries:
        return "cubin", arch
    older = [a for a in binaries if a == f"sm_{arch_number(a)}" and arch_number(a) <= arch_number(arch)]
    if not older:
        return None
    return "ptx", max(older, key=arch_number)


def load_kernels(gpu, program, read, arch):
    """{kernel name: Function} for every kernel of `program` (program.json as a dict): each kernel's own
    module through `gpu.load_function`, the CUBIN for `arch` or else PTX; `read(file)` returns a file's
    bytes, checked against its sha256 in program.json."""
    functions = {}
    for kernel in program["kernels"]:
        name = kernel["name"]
        binaries = kernel.get("binaries") or {}
        choice = choose_binary(binaries, arch)
        if choice is None:
            have = ", ".join(sorted(binaries, key=arch_number)) or "none"
            raise LoadError(f"kernel {name} has no CUBIN for {arch} and no PTX for an older arch "
                            f"(built for: {have}); recompile with --arch {arch}")
        kind, built = choice
        entry = binaries[built][kind]
        data = read(entry["file"])
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise LoadError(f"{entry['file']} does not match its sha256 in program.json; recompile")
        if kind == "ptx" and not data.endswith(b"\0"):
            data += b"\0"  # cuModuleLoadData reads PTX as a NUL-terminated string
        functions[name] = gpu.load_function(data, name)
    return functions


class Prepared:
    """A launch made concrete for the attached device: its grid, and why that grid."""

    def __init__(self, fn, grid, block, shared, cooperative, resident, why):
        self.fn, self.grid, self.block, self.shared = fn, grid, block, shared
        self.cooperative, self.resident, self.why = cooperative, resident, why


def prepare_launch(gpu, fn, launch):
    """Apply the launch rules to one program.json launch: opt in to its dynamic shared memory, ask the
    driver how many blocks are resident per SM at the compiled registers, and cap a cooperative kernel's
    grid to one wave (its blocks loop over the tiles, so any grid up to the tile count is correct)."""
    block, shared = launch["block"], launch["shared_bytes"]
    if block > fn.max_threads:
        raise LoadError(f"kernel {fn.name} runs {block} threads per block but its compiled code allows "
                        f"{fn.max_threads} ({fn.registers} registers per thread): use a smaller tile")
    if shared + fn.static_shared > 48 * 1024:  # static + dynamic over 48 KiB needs the opt-in
        gpu.allow_shared(fn, shared)
    per_sm = gpu.resident_blocks(fn, block, shared)
    if per_sm <= 0:
        raise LoadError(f"kernel {fn.name} cannot be resident on {gpu.name}: {block} threads x {fn.registers} "
                        f"registers, {shared} B dynamic shared memory per block; use a smaller tile")
    wave = per_sm * gpu.sm_count
    if not launch["cooperative"]:
        return Prepared(fn, launch["grid"], block, shared, False, per_sm, "one block per tile")
    if not gpu.cooperative:
        raise LoadError(f"kernel {fn.name} has grid barriers but {gpu.name} does not support cooperative "
                        "launch: connect those edges at KERNEL")
    tiles = launch.get("tiles", launch["grid"])
    grid = min(tiles, wave)
    why = (f"cooperative: {grid} of {tiles} tiles resident at once ({per_sm}/SM x {gpu.sm_count} SMs at "
           f"{fn.registers} registers, measured occupancy)")
    return Prepared(fn, grid, block, shared, True, per_sm, why)


def bind_buffers(gpu, program, tensors):
    """Device buffers for program.json: ({tensor: device pointer}, [allocations to free]). Intermediates
    share one arena at their planned offsets; inputs and constants are uploaded from `tensors`."""
    buffers = {b["tensor"]: b for b in program["buffers"]}
    arena = gpu.alloc(program["memory"]["arena_bytes"])
    owned, ptrs = [arena], {}
    try:
        for name, buf in buffers.items():
            if buf.get("offset") is not None and buf["role"] == "intermediate":
                ptrs[name] = arena + buf["offset"]
                continue
            ptrs[name] = gpu.alloc(buf["nbytes"])
            owned.append(ptrs[name])
            if name in program["inputs"] or name in program["constants"]:
                gpu.upload(ptrs[name], host_array(buf, tensors))
    except BaseException:
        for ptr in owned:
            gpu.free(ptr)
        raise
    return ptrs, owned


def run_launches(gpu, program, functions, tensors, repeat=1, warmup=1):
    """Run program.json's launch list on `gpu`. `tensors` maps input and constant tensor names to NumPy
    arrays; intermediates share one arena at their planned offsets. Returns ({output tensor: array},
    [(kernel, median µs, samples, Prepared)]). Every launch is prepared (attributes, occupancy) before
    any is timed; the events bracket the launches only."""
    ptrs, owned = bind_buffers(gpu, program, tensors)
    try:
        prepared = [prepare_launch(gpu, functions[ln["kernel"]], ln) for ln in program["launches"]]
        times = []
        for ln, p in zip(program["launches"], prepared):
            args = [ptrs[t] for t in ln["args"]]

            def run(p=p, args=args):
                gpu.launch(p.fn, p.grid, p.block, p.shared, args, p.cooperative)

            us, n = gpu.time_launches(ln["kernel"], run, repeat=repeat, warmup=warmup)
            times.append((ln["kernel"], us, n, p))
        buffers = {b["tensor"]: b for b in program["buffers"]}
        outs = {}
        for name in program["outputs"]:
            buf = buffers[name]
            outs[name] = np.empty(buf["shape"], np.dtype(buf["dtype"]))
            gpu.download(outs[name], ptrs[name])
        return outs, times
    finally:
        for ptr in owned:
            gpu.free(ptr)


def time_program(gpu, program, functions, tensors, repeat=1, warmup=1):
    """Median µs of the whole launch list run back to back, `repeat` times between two events after
    `warmup` untimed runs: the program's time as it runs, each launch's overhead overlapping the one
    before (run_launches times each kernel alone, its launch included)."""
    ptrs, owned = bind_buffers(gpu, program, tensors)
    try:
        calls = []
        for ln in program["launches"]:
            p = prepare_launch(gpu, functions[ln["kernel"]], ln)
            calls.append((p, [ptrs[t] for t in ln["args"]]))

        def run():
            for p, args in calls:
                gpu.launch(p.fn, p.grid, p.block, p.shared, args, p.cooperative)

        us, _ = gpu.time_launches(program.get("name", "program"), run, repeat=repeat, warmup=warmup)
        return us
    finally:
        for ptr in owned:
            gpu.free(ptr)


def host_array(buf, tensors):
    """The C-contiguous host array for an input/constant buffer of program.json, checked against it."""
    name = buf["tensor"]
    if name not in tensors:
        what = "weight" if buf["role"] == "constant" else "input"
        raise LoadError(f"missing {what} '{name}' (shape {buf['shape']}, {buf['dtype']})")
    arr = np.ascontiguousarray(tensors[name], dtype=np.dtype(buf["dtype"]))
    if list(arr.shape) != list(buf["shape"]):
        raise LoadError(f"{buf['role']} '{name}' has shape {list(arr.shape)}, expected {list(buf['shape'])}")
    return arr
