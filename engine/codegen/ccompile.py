"""C source in, path to a cached shared library out (system C compiler + OpenMP), for the CPU backend.

Libraries live under `cache_dir()/cc/`, keyed on source, options and compiler version; `load_library`
opens one with ctypes.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from engine.cache import touch, trim_soon
from engine.codegen.kir import ENTRY_COMMENT, PROGRAM_ENTRY
from engine.errors import CompileError, TimeLimitError
from engine.files import write_atomic
from engine.flags import cache_dir, debug, time_limit_s
from engine.limits import RAISE_IT, WorkerTimeout, run_worker

# -ffp-contract=off: no fused multiply-adds, so the C backend rounds like the NumPy reference.
# -fno-math-errno lets expf/sqrtf vectorise without changing results.
# DEFAULT_OPTIONS are portable; compile_c adds -march=native (see default_options) unless given options.
# A binary built for one CPU dies with SIGILL on another, so any option naming "native" folds the
# host's CPU into the cache key (see _host_fingerprint): a shared cache (NFS home, CI cache) never
# hands such a binary to another CPU.
DEFAULT_OPTIONS: tuple[str, ...] = (
    "-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-std=c11", "-shared", "-fPIC",
)
LINK_LIBS: tuple[str, ...] = ("-lm",)  # after the source file, where the linker looks for them
_CACHE_FORMAT = 2  # 2: programs are linked from per-kernel units whoever compiles them (measure.compile_variant built some whole)
_COMPILE_TIMEOUT_S = 600  # without --time-limit / TILEWEAVE_TIME_LIMIT


def default_options() -> tuple[str, ...]:
    """DEFAULT_OPTIONS plus -march=native where the compiler accepts it: loops vectorise at the host's
    full width (AVX-512 where it has it). Per-ISA function clones (target_clones) are no substitute:
    GCC 12 sizes an `omp simd` loop's lanes for the baseline ISA before cloning, so the AVX2 clone of a
    row reduction ran on 16-byte vectors."""
    return _default_options(tuple(find_compiler()))


@functools.cache
def _default_options(cmd: tuple[str, ...]) -> tuple[str, ...]:
    try:
        proc = subprocess.run([*cmd, "-march=native", "-x", "c", "-fsyntax-only", "-"], input="int x;\n",
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return DEFAULT_OPTIONS
    return (*DEFAULT_OPTIONS, "-march=native") if proc.returncode == 0 else DEFAULT_OPTIONS


def compiler_lanes() -> int:
    """fp32 lanes of the widest vector registers the C kernels are compiled for (`default_options`):
    16 where the compiler defines __AVX512F__, 8 for __AVX__, else 4, read from the compiler's predefined
    macros. The host probe (engine/host.py) is compiled with this as -DTW_LANES, so the host Device's
    vector_lanes and the kernels' lanes are one rule."""
    return _compiler_lanes(tuple(find_compiler()), default_options())


@functools.cache
def _compiler_lanes(cmd: tuple[str, ...], options: tuple[str, ...]) -> int:
    try:
        proc = subprocess.run([*cmd, *[o for o in options if o.startswith("-m")], "-dM", "-E", "-x", "c", "-"],
                              input="", capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 4
    macros = {line.split()[1] for line in proc.stdout.splitlines() if line.startswith("#define ")}
    return 16 if "__AVX512F__" in macros else 8 if "__AVX__" in macros else 4


def find_compiler(cxx: bool = False) -> list[str]:
    """The C compiler command: $CC (may carry arguments, e.g. "ccache gcc"), else cc, else gcc.
    With `cxx`, the C++ compiler: $CXX, else c++, else g++ (the cuda-sim emulator's kernels)."""
    var, candidates, package = ("CXX", ("c++", "g++"), "g++") if cxx else ("CC", ("cc", "gcc"), "gcc")
    env = os.environ.get(var, "").strip()
    if env:
        cmd = shlex.split(env)
        if shutil.which(cmd[0]) is None:
            raise CompileError(f"{var}={env!r} is not an executable on PATH: install it or unset {var}")
        return cmd
    for candidate in candidates:
        if shutil.which(candidate):
            return [candidate]
    raise CompileError(f"no {'C++' if cxx else 'C'} compiler found: install {package} "
                       f"(apt-get install {package}) or set {var}")


@functools.cache
def _compiler_version(cmd: tuple[str, ...]) -> str:
    """`cc --version` output: a compiler upgrade must miss the cache."""
    try:
        out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError as err:
        raise CompileError(f"C compiler {shlex.join(cmd)} cannot run ({err.strerror}): install gcc or set CC") from None
    return out.stdout.strip() or out.stderr.strip()


@functools.cache
def _host_fingerprint() -> str:
    """Machine + CPU model + feature flags: what -march=native compiles for."""
    parts = [platform.machine()]
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        for field in ("model name", "flags", "Features"):
            match = re.search(rf"^{field}\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
            if match:
                parts.append(match.group(1).strip())
    except OSError:
        parts.append(platform.processor())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "program"



def _first_error(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"\b(fatal )?error\b", line)]
    first = errors[0] if errors else (lines[0] if lines else "no output")
    return f"{first} (+{len(errors) - 1} more)" if len(errors) > 1 else first


def compile_c(source: str, *, name: str, options: tuple[str, ...] | None = None, cxx: bool = False,
              timeout: float | None = None, poll=None) -> Path:
    """Compile `source` to a shared library and return its path; a cache hit runs no compiler.
    `options` default to default_options(). `cxx`: the source is C++ (built with find_compiler(cxx=True)).
    `timeout`: seconds the compiler may take (default: TILEWEAVE_TIME_LIMIT, else 600); past it the
    compiler is killed, nothing is cached and TimeLimitError says so. `poll(elapsed)` is called while the
    compiler runs; whatever it raises (the app's Cancel) kills the compiler and propagates."""
    cmd = find_compiler(cxx)
    options = _default_options(tuple(cmd)) if options is None else tuple(options)
    key_parts = [_CACHE_FORMAT, source, list(options), list(LINK_LIBS), _compiler_version(tuple(cmd))]
    if any("native" in opt for opt in options):
        key_parts.append(_host_fingerprint())
    key = hashlib.sha256(json.dumps(key_parts).encode()).hexdigest()
    stem = f"{_safe(name)}-{key[:20]}"
    folder = cache_dir() / "cc"
    lib = folder / f"{stem}.so"
    if lib.exists():
        debug(2, f"cc {name}: cache hit {lib.name}")
        touch(lib)  # used now: `tileweave cache --prune` removes the least recently used first
        return lib

    # The source stays beside the library: it is what the repro command and a debugger point at.
    src = folder / f"{stem}.{'cpp' if cxx else 'c'}"
    write_atomic(src, source.encode())
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{stem}.", suffix=".so.tmp")
    os.close(fd)
    argv = [*cmd, *options, str(src), "-o", tmp, *LINK_LIBS]
    timeout = timeout or time_limit_s() or _COMPILE_TIMEOUT_S
    try:  # in its own process group: running out of time kills cc1/as/ld too, not only the driver
        code, out, errout = run_worker(argv, timeout=timeout, env=dict(os.environ), poll=poll)
        if code != 0:
            repro = shlex.join([*cmd, *options, str(src), "-o", str(lib), *LINK_LIBS])
            log = (errout + out).strip()
            err = CompileError(f"{'C++' if cxx else 'C'} program {name} failed to compile: {_first_error(log)}; reproduce: {repro}")
            err.log = log  # the full compiler output
            err.source_path = src
            raise err
        os.replace(tmp, lib)
        trim_soon()
    except WorkerTimeout:
        lang = "C++" if cxx else "C"
        raise TimeLimitError(f"the {lang} compile of {name} did not finish within the {timeout:g} s time limit",
                             hint=f"{RAISE_IT}; reproduce: {shlex.join([*cmd, *options, str(src), '-o', str(lib)])}"
                             ) from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    debug(2, f"cc {name}: compiled {lib.name}")
    return lib


def load_library(path: str | Path) -> ctypes.CDLL:
    """Open a compiled library; set argtypes/restype on its functions before calling them."""
    try:
        return ctypes.CDLL(str(path))
    except OSError as err:
        raise CompileError(f"cannot load {path}: {err}; delete it to force a rebuild") from None


# ---- per-kernel objects: an edit recompiles only the kernels whose source changed -------------------

_KERNEL_DEF = re.compile(r"^// (\w+): stages ", re.M)  # the comment each printed kernel starts with
UNIT_SYMBOL = "tw_kernel_unit"  # each kernel is printed and compiled under this name, renamed when linked

Units = Callable[[], tuple[str, list[tuple[str, str]]]]


def split_kernels(source: str) -> tuple[str, list[tuple[str, str]]] | None:
    """(prelude, [(kernel name, its code)]) of a program's C source as the printer writes it: the prelude
    (includes, macros, static inline helpers) up to the first kernel's `// name: stages` comment; each
    kernel (comment, its static index tables, its function) up to the next. None when there are fewer
    than two kernels. For showing one kernel at a time (the app's Kernels page); the compile cache gets
    its units from the printer (targets.render_c_units), never by cutting and renaming text."""
    starts = list(_KERNEL_DEF.finditer(source))
    if len(starts) < 2:
        return None
    entry = source.find("\n" + ENTRY_COMMENT, starts[-1].start())  # the program entry follows the kernels
    ends = [m.start() for m in starts[1:]] + [entry + 1 if entry >= 0 else len(source)]
    return source[:starts[0].start()], [(m.group(1), source[m.start():end]) for m, end in zip(starts, ends)]


def compile_c_kernels(source: str, *, name: str, units: Units | None = None, timeout: float | None = None,
                      poll=None) -> Path:
    """compile_c for a program's C source, built as one object per kernel and linked: `units` gives
    (prelude, [(kernel name, its code printed under UNIT_SYMBOL)]) — targets.render_c_units, called only
    when the library is not cached — and each object is cached on prelude + unit, so after an edit only
    the kernels whose code changed are compiled again (renumbered kernel names included: the printer
    named the function UNIT_SYMBOL, and the linker step gives the object's symbol the kernel's name
    with objcopy). Same library path and cache hit as compile_c; without units, with fewer than two
    kernels, without objcopy or where a unit fails, compile_c builds it whole (and reports any error)."""
    cmd = find_compiler()
    options = _default_options(tuple(cmd))
    key_parts = [_CACHE_FORMAT, source, list(options), list(LINK_LIBS), _compiler_version(tuple(cmd))]
    if any("native" in opt for opt in options):
        key_parts.append(_host_fingerprint())
    key = hashlib.sha256(json.dumps(key_parts).encode()).hexdigest()
    folder = cache_dir() / "cc"
    lib = folder / f"{_safe(name)}-{key[:20]}.so"
    if lib.exists() or units is None or shutil.which("objcopy") is None:
        return compile_c(source, name=name, timeout=timeout, poll=poll)
    prelude, kernels = units()
    # The program entry (last, under its own name; see targets.program_entry) is a few lines that need no
    # prelude: compiled in the link step, not as a unit of its own (a compiler run per program).
    entry = kernels.pop()[1] if kernels and kernels[-1][0] == PROGRAM_ENTRY else None
    if len(kernels) < 2:  # nothing to gain
        return compile_c(source, name=name, timeout=timeout, poll=poll)
    timeout = timeout or time_limit_s() or _COMPILE_TIMEOUT_S
    deadline = time.monotonic() + timeout
    objects = folder / "obj"
    objects.mkdir(parents=True, exist_ok=True)
    unit_options = [o for o in options if o != "-shared"]
    work = Path(tempfile.mkdtemp(dir=folder, prefix=f".{_safe(name)}."))
    try:
        linked = []
        for kernel, text in kernels:
            unit = prelude + text  # the function and its tables (tab_<UNIT_SYMBOL>_…)
            unit_key = hashlib.sha256(json.dumps(key_parts[:1] + [unit] + key_parts[2:]).encode()).hexdigest()
            obj = objects / f"{unit_key[:24]}.o"
            if obj.exists():
                touch(obj)
            else:
                src = work / f"{_safe(kernel)}.c"
                src.write_text(unit)
                tmp = work / f"{_safe(kernel)}.o"
                code, out, err = run_worker([*cmd, *unit_options, "-c", str(src), "-o", str(tmp)],
                                            timeout=max(deadline - time.monotonic(), 0.1), poll=poll, env=dict(os.environ))
                if code != 0:
                    debug(2, f"cc {name}: kernel {kernel} failed alone ({_first_error(err + out)}); building whole")
                    return compile_c(source, name=name, timeout=max(deadline - time.monotonic(), 0.1), poll=poll)
                os.replace(tmp, obj)
                debug(2, f"cc {name}: compiled kernel {kernel}")
            named = work / f"{_safe(kernel)}.linked.o"
            code, out, err = run_worker(["objcopy", f"--redefine-sym={UNIT_SYMBOL}={kernel}", str(obj), str(named)],
                                        timeout=max(deadline - time.monotonic(), 0.1), poll=poll, env=dict(os.environ))
            if code != 0:
                return compile_c(source, name=name, timeout=max(deadline - time.monotonic(), 0.1), poll=poll)
            linked.append(str(named))
        write_atomic(folder / f"{lib.stem}.c", source.encode())  # beside the library, as compile_c keeps it
        if entry is not None:
            (work / "entry.c").write_text(entry)
            linked.append(str(work / "entry.c"))
        tmp = work / "lib.so"
        code, out, err = run_worker([*cmd, *options, *linked, "-o", str(tmp), *LINK_LIBS],
                                    timeout=max(deadline - time.monotonic(), 0.1), poll=poll, env=dict(os.environ))
        if code != 0:
            return compile_c(source, name=name, timeout=max(deadline - time.monotonic(), 0.1), poll=poll)
        os.replace(tmp, lib)
        trim_soon()
    except WorkerTimeout:
        raise TimeLimitError(f"the C compile of {name} did not finish within the {timeout:g} s time limit",
                             hint=RAISE_IT) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    debug(2, f"cc {name}: linked {len(kernels)} kernel objects into {lib.name}")
    return lib
