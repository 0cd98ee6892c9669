"""CUDA C source in, `CudaBinary` (PTX text + sm_XX CUBIN) out, compiled with NVRTC; no GPU needed.

Results are cached on disk under `cache_dir()/nvrtc/`. `python -m engine.codegen.nvrtc FILE --arch sm_80`
compiles a saved source by hand (the command printed when a compile fails).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import threading
from pathlib import Path

from engine.cache import touch, trim_soon
from engine.errors import CompileError
from engine.files import write_atomic
from engine.flags import cache_dir, debug

# C++17 for the CCCL headers cooperative_groups pulls in. No --use_fast_math: generated kernels are
# checked against onnxruntime and the C backend, and fast-math exp/div/sqrt break those tolerances.
DEFAULT_OPTIONS: tuple[str, ...] = ("-std=c++17",)
# Options that make compiling faster without changing a byte of PTX or CUBIN (checked by a test), so
# they stay out of the cache key. Automatic precompiled headers: every kernel is its own translation
# unit with the same cuda_fp16.h + cooperative_groups.h prelude (~0.9 s to parse); NVRTC keeps the
# parsed prelude in a per-process temp folder and reuses it, 2-6x faster per kernel after the first.
# 629 is its "options differ from the PCH's" note when a second arch makes its own.
SPEED_OPTIONS: tuple[str, ...] = ("-pch", "--pch-messages=false", "-diag-suppress=629")
# Where NVRTC writes those headers: a folder of this process's own under the cache (`pch_options`). Left to
# itself NVRTC makes /tmp/__nvrtc_auto_pch_PID_0 and deletes it when the process exits normally — but a process
# that ends by os._exit or a signal (pytest-xdist's workers, a worker past its time limit) leaves 100-300 MB
# there: 59 such folders, 9.8 GB, had piled up in this machine's /tmp over three days of test runs.
_PCH: tuple[int, str | None] | None = None  # (pid, this process's folder) once made
NVRTC_PIP = "nvidia-cuda-nvrtc==13.0.88"
HEADERS_PIP = "nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85"
_CACHE_FORMAT = 1  # bump when the cache entry layout changes
_ARCH_RE = re.compile(r"^sm_(\d{2,3})([af]?)$")
# One NVRTC compile at a time per process: the automatic-PCH heap is process-wide, and two threads
# gain nothing on this compile (measured: 2 threads 6.1 s vs serial 4.9 s for bert_layer's kernels).
_NVRTC_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class CudaBinary:
    """One compiled translation unit. `ptx` targets `arch` too, so a newer driver can JIT it."""

    name: str
    ptx: str
    cubin: bytes
    log: str
    arch: str
    options: tuple[str, ...]  # every option that shaped the binary except -arch and the -I paths
    nvrtc_version: tuple[int, int]

    @property
    def ptx_isa(self) -> str:
        return ptx_isa_version(self.ptx)

    def resources(self, kernel: str):
        """What the compiler gave `kernel` in this CUBIN (registers, local and static shared bytes)."""
        from engine.codegen.cubin import cubin_resources

        found = cubin_resources(self.cubin)
        if kernel not in found:
            raise CompileError(f"CUBIN {self.name} ({self.arch}) has no kernel {kernel} (it has "
                               f"{', '.join(sorted(found)) or 'none'})")
        return found[kernel]


def _load_nvrtc():
    """The cuda.bindings.nvrtc module with libnvrtc loaded, or a CompileError saying what to install."""
    try:
        from cuda.bindings import nvrtc
        from cuda.pathfinder import DynamicLibNotFoundError, load_nvidia_dynamic_lib
    except ImportError as err:
        raise CompileError(f"cuda-bindings is not importable ({err}): pip install cuda-bindings==13.0.3 {NVRTC_PIP}") from None
    try:
        # Load through pathfinder first so a missing library is a clear error, not a failure
        # deep inside the first nvrtc call.
        load_nvidia_dynamic_lib("nvrtc")
    except DynamicLibNotFoundError:
        raise CompileError(f"the NVRTC library (libnvrtc) was not found: pip install {NVRTC_PIP}") from None
    return nvrtc


def _check(nvrtc, result, what: str) -> None:
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"NVRTC {what} failed with {result.name}; reinstall {NVRTC_PIP}")


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the loaded NVRTC, e.g. (13, 0)."""
    nvrtc = _load_nvrtc()
    result, major, minor = nvrtc.nvrtcVersion()
    _check(nvrtc, result, "nvrtcVersion")
    return major, minor


@functools.cache
def _nvrtc_build() -> str:
    """Version string for cache keys: nvrtcVersion only says 13.0, the wheel says which 13.0 build."""
    from importlib import metadata

    major, minor = nvrtc_version()
    try:
        return f"{major}.{minor}/{metadata.version('nvidia-cuda-nvrtc')}"
    except metadata.PackageNotFoundError:
        return f"{major}.{minor}"


@functools.cache
def supported_archs() -> tuple[str, ...]:
    """Real architectures this NVRTC can emit CUBIN for, e.g. ("sm_75", "sm_80", ...)."""
    nvrtc = _load_nvrtc()
    result, archs = nvrtc.nvrtcGetSupportedArchs()
    _check(nvrtc, result, "nvrtcGetSupportedArchs")
    return tuple(f"sm_{a}" for a in archs)


@functools.cache
def include_dirs() -> tuple[str, ...]:
    """Header folders NVRTC needs: the CUDA runtime headers (cuda_fp16.h, cooperative_groups.h, crt/)
    and CCCL (cuda/std/..., which CUDA 13's cooperative_groups and cuda_fp16 include)."""
    from cuda.pathfinder import find_nvidia_header_directory

    dirs = []
    for lib in ("cudart", "cccl"):
        found = find_nvidia_header_directory(lib)
        if found is None:
            raise CompileError(f"CUDA headers for {lib} not found: pip install {HEADERS_PIP}")
        dirs.append(found)
    return tuple(dirs)


def ptx_isa_version(ptx: str) -> str:
    """The PTX ISA version a PTX text declares (its `.version` directive), e.g. "9.0"."""
    match = re.search(r"^\s*\.version\s+(\d+\.\d+)", ptx, re.MULTILINE)
    if match is None:
        raise ValueError("no .version directive in PTX text")
    return match.group(1)


def check_arch(arch: str) -> None:
    """CompileError (one line) unless `arch` is a real architecture this NVRTC emits CUBIN for."""
    match = _ARCH_RE.match(arch)
    if match is None:
        raise CompileError(f"arch {arch!r} is not a real GPU architecture: use the form sm_80 (Device.nvrtc_arch)")
    if f"sm_{match.group(1)}" not in supported_archs():
        major, minor = nvrtc_version()
        raise CompileError(
            f"arch {arch} is not supported by NVRTC {major}.{minor} (supported: {', '.join(supported_archs())}); "
            "use a newer arch (the v100 preset compiles for sm_75)"
        )


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "kernel"



def _run_nvrtc(source: str, name: str, options: list[str]) -> tuple[bool, str, bytes, str]:
    """One NVRTC compile: (ok, ptx, cubin, log). With a real -arch=sm_XX NVRTC returns both the
    PTX (identical to a compute_XX compile) and the CUBIN, so one pass serves both."""
    nvrtc = _load_nvrtc()
    result, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    _check(nvrtc, result, "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in options]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        ok = result == nvrtc.nvrtcResult.NVRTC_SUCCESS
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        log_text = log.rstrip(b"\0").decode(errors="replace").strip()
        if not ok:
            return False, "", b"", log_text or result.name
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetPTX(prog, ptx)[0], "nvrtcGetPTX")
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin)[0], "nvrtcGetCUBIN")
        return True, ptx.rstrip(b"\0").decode(), cubin, log_text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _first_error(log: str) -> str:
    """The first error line of an NVRTC log, with a count of the rest."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"\berror\b", line) and "detected in the compilation" not in line]
    first = errors[0] if errors else (lines[0] if lines else "no log")
    total = re.search(r"(\d+) errors? detected", log)
    more = int(total.group(1)) - 1 if total else len(errors) - 1
    return f"{first} (+{more} more)" if more > 0 else first


def compile_cuda(
    source: str, *, name: str, arch: str = "sm_80", options: tuple[str, ...] = (), use_cache: bool = True
) -> CudaBinary:
    """Compile CUDA C `source` for `arch` (e.g. "sm_80") to PTX and CUBIN, through the disk cache.

    The cache key is sha256 over (source, arch, options, NVRTC build); include paths are left out
    because the headers are pinned together with NVRTC. A hit never calls NVRTC's compiler.
    """
    for opt in options:
        if opt.startswith(("-arch", "--gpu-architecture")):
            raise CompileError(f"option {opt!r} for kernel {name}: pass the architecture as arch=\"sm_80\" instead")
    version = nvrtc_version()
    check_arch(arch)
    opts = DEFAULT_OPTIONS + tuple(options)
    key = hashlib.sha256(
        json.dumps([_CACHE_FORMAT, source, arch, list(opts), _nvrtc_build()]).encode()
    ).hexdigest()
    entry = cache_dir() / "nvrtc" / f"{key}.json"
    if use_cache:
        cached = _read_entry(entry, name)
        if cached is not None:
            debug(2, f"nvrtc {name} {arch}: cache hit {entry.name}")
            touch(entry)  # used now: `tileweave cache --prune` removes the least recently used first
            return cached

    speed = pch_options()
    full = [f"-arch={arch}", *opts, *speed, *(f"-I{d}" for d in include_dirs())]
    with _NVRTC_LOCK:
        ok, ptx, cubin, log = _run_nvrtc(source, name, full)
        if not ok:  # the automatic precompiled header is an optimisation: never let it be why a kernel fails
            plain = [o for o in full if o not in speed]
            ok, ptx, cubin, plain_log = _run_nvrtc(source, name, plain)
            if ok:  # kept for a bug report: the source and what NVRTC said with the PCH
                kept = cache_dir() / "nvrtc" / "failed" / f"{_safe(name)}-{key[:12]}.pch"
                write_atomic(kept.with_suffix(".pch.cu"), source.encode())
                write_atomic(kept.with_suffix(".pch.log"), log.encode())
                debug(0, f"nvrtc {name} {arch}: failed with {' '.join(SPEED_OPTIONS)} and compiled without "
                         f"({_first_error(log)}); source and log kept in {kept.parent}")
                log = f"compiled without {' '.join(SPEED_OPTIONS)}; with them NVRTC said:\n{log}\n{plain_log}"
            else:
                log = plain_log
    if not ok:
        saved = cache_dir() / "nvrtc" / "failed" / f"{_safe(name)}-{key[:12]}.cu"
        write_atomic(saved, source.encode())
        write_atomic(saved.with_suffix(".log"), log.encode())
        repro = f"python -m engine.codegen.nvrtc {saved} --arch {arch}"
        repro += "".join(f" --option={o}" for o in options)
        err = CompileError(f"kernel {name} failed to compile for {arch}: {_first_error(log)}; reproduce: {repro}")
        err.log = log  # the full NVRTC log, for DEBUG output and the UI
        err.source_path = saved
        raise err
    binary = CudaBinary(name=name, ptx=ptx, cubin=cubin, log=log, arch=arch, options=opts, nvrtc_version=version)
    debug(2, f"nvrtc {name} {arch}: compiled, PTX ISA {binary.ptx_isa}, {len(cubin)} B cubin")
    if use_cache:
        record = dataclasses.asdict(binary) | {"cubin": base64.b64encode(cubin).decode()}
        write_atomic(entry, json.dumps(record).encode())
        trim_soon()
    return binary


def pch_options() -> tuple[str, ...]:
    """SPEED_OPTIONS, with `--pch-dir` naming this process's own folder for the automatic precompiled headers:
    `cache_dir()/nvrtc/pch/HOST-PID`, emptied when made. Making it first removes the folders of this host's
    processes that are gone (NVRTC deletes its files when a process exits normally; one that ended otherwise
    left them). Without a usable cache folder, NVRTC's own temp folder (SPEED_OPTIONS alone)."""
    global _PCH
    if "-pch" not in SPEED_OPTIONS:
        return SPEED_OPTIONS
    pid = os.getpid()
    if _PCH is None or _PCH[0] != pid:  # a forked child makes its own
        _PCH = (pid, _own_pch_dir(pid))
    return SPEED_OPTIONS + ((f"--pch-dir={_PCH[1]}",) if _PCH[1] else ())


def _own_pch_dir(pid: int) -> str | None:
    host = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"
    root = cache_dir() / "nvrtc" / "pch"
    try:
        root.mkdir(parents=True, exist_ok=True)
        for old in root.iterdir():
            owner, _, number = old.name.rpartition("-")
            if owner == host and number.isdigit() and (int(number) == pid or not _alive(int(number))):
                shutil.rmtree(old, ignore_errors=True)
        mine = root / f"{host}-{pid}"
        mine.mkdir()
        return str(mine)
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def _read_entry(path: Path, name: str) -> CudaBinary | None:
    """A cached binary, or None when absent or unreadable (a damaged entry is simply recompiled)."""
    try:
        record = json.loads(path.read_text())
        return CudaBinary(
            name=name,
            ptx=record["ptx"],
            cubin=base64.b64decode(record["cubin"]),
            log=record["log"],
            arch=record["arch"],
            options=tuple(record["options"]),
            nvrtc_version=tuple(record["nvrtc_version"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(argv: list[str] | None = None) -> int:
    """Compile a .cu file and report; write NAME.ptx / NAME.cubin with --out."""
    parser = argparse.ArgumentParser(prog="python -m engine.codegen.nvrtc", description=main.__doc__)
    parser.add_argument("file", type=Path)
    parser.add_argument("--arch", default="sm_80")
    parser.add_argument("--option", action="append", default=[], help="extra NVRTC option (repeatable)")
    parser.add_argument("--out", type=Path, help="folder to write NAME.ptx and NAME.cubin into")
    args = parser.parse_args(argv)
    name = re.sub(r"-[0-9a-f]{12}$", "", args.file.stem)  # a saved failure is NAME-KEY.cu
    try:
        binary = compile_cuda(args.file.read_text(), name=name, arch=args.arch, options=tuple(args.option),
                              use_cache=False)
    except CompileError as err:
        print(getattr(err, "log", ""), file=sys.stderr)
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except OSError as err:
        print(f"error: cannot read {args.file}: {err.strerror}", file=sys.stderr)
        return 2
    if binary.log:
        print(binary.log)
    print(f"{name}: {args.arch}, PTX ISA {binary.ptx_isa}, {len(binary.ptx)} B PTX, {len(binary.cubin)} B CUBIN")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{name}.ptx").write_text(binary.ptx)
        (args.out / f"{name}.cubin").write_bytes(binary.cubin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
