"""program.json + a file reader + the pycuda driver in; one loaded module per kernel and its launches out.

Shared by the CUDA executor (engine/runtime/cuda.py) and the bundle's standalone run_cuda.py, which
embeds the code below this docstring verbatim: keep it standard-library only, with no engine imports.
"""

import hashlib

SHARED_OPT_IN = 48 * 1024  # dynamic shared memory above this needs the per-function opt-in


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


def load_kernels(cuda, program, read, arch):
    """{kernel name: function} for every kernel of `program` (program.json as a dict): each kernel's
    own module from `cuda.module_from_buffer` (pycuda.driver, or a stand-in), the CUBIN for `arch` or
    else PTX; `read(file)` returns a file's bytes, checked against its sha256 in program.json."""
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
        functions[name] = cuda.module_from_buffer(data).get_function(name)
    return functions


def launch_kernel(cuda, function, launch, args):
    """One launch of program.json's launch list: dynamic shared memory (opted in above 48 KiB), and
    cuLaunchCooperativeKernel for kernels with grid barriers (the grid is one resident wave)."""
    shared = launch["shared_bytes"]
    if shared > SHARED_OPT_IN:
        function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
    if launch["cooperative"]:
        cooperative = getattr(cuda, "launch_cooperative_kernel", None)
        if cooperative is None:
            raise LoadError(f"kernel {launch['kernel']} needs a cooperative launch, which this pycuda does not "
                            "expose: upgrade pycuda")
        cooperative(function, (launch["grid"], 1, 1), (launch["block"], 1, 1), args, shared_mem_bytes=shared)
    else:
        function(*args, grid=(launch["grid"], 1), block=(launch["block"], 1, 1), shared=shared)
