"""Memory budget of a run: a stated byte limit (the --memory-budget flag, else the device's memory for
a GPU backend, else a fraction of host RAM) in; every buffer a run would allocate (inputs, constants,
intermediates or the arena, outputs) summed and refused in one line *before* anything is allocated."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from engine.errors import ShapeError, TileweaveError

HOST_FRACTION = 0.5  # default budget of a CPU-side run: half of the host's physical memory
GPU_BACKENDS = ("cuda",)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000**4,
          "tib": 1 << 40}


@dataclass(frozen=True)
class Budget:
    nbytes: int
    source: str  # where the figure came from, quoted in every refusal


def parse_size(text: str | int, flag: str = "--memory-budget") -> int:
    """`"8GiB"`, `"512M"` (binary), `"2GB"` (decimal), `"1e9"` or an int -> bytes (> 0); errors name `flag`
    (also `tileweave cache --prune`, TILEWEAVE_CACHE_MAX)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
        unit = m and m.group(2).lower()
        if not m or unit not in _UNITS:
            raise TileweaveError(f"{flag} '{text}' is not a size",
                                 hint="write bytes or a number with a unit, e.g. 8GiB, 512MiB, 2GB")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise TileweaveError(f"{flag} must be positive, got {text}", hint=f"e.g. {flag} 8GiB")
    return value


def host_memory_bytes() -> int:
    """Physical memory of this machine (0 when the OS does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


def memory_budget(flag: str | int | None = None, *, device=None, backend: str = "reference") -> Budget:
    """The budget a run is checked against: `flag` when given; for a GPU backend the device's
    memory_bytes (datasheet for presets, `memory_bytes` in a device file); otherwise HOST_FRACTION of
    host RAM (cuda-sim: also at most the device's memory, since it stands in for the GPU)."""
    if flag is not None:
        return Budget(parse_size(flag), "--memory-budget")
    dev = None
    if device is not None:
        from engine.device import get_device

        dev = get_device(device)
    if backend in GPU_BACKENDS and dev is not None:
        return Budget(dev.memory_bytes, f"{dev.name} memory_bytes ({dev.source_of('memory_bytes')})")
    host = host_memory_bytes()
    budget = Budget(int(host * HOST_FRACTION), f"{HOST_FRACTION:g} of host RAM ({format_bytes(host)})") if host \
        else Budget(1 << 62, "host RAM unknown")
    if backend == "cuda-sim" and dev is not None and dev.memory_bytes < budget.nbytes:
        budget = Budget(dev.memory_bytes, f"{dev.name} memory_bytes ({dev.source_of('memory_bytes')})")
    return budget


def format_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _refuse(what: str, need: int, budget: Budget, largest: tuple[str, str, int] | None) -> None:
    biggest = f"; the largest is {largest[0]} '{largest[1]}' ({format_bytes(largest[2])})" if largest else ""
    raise ShapeError(f"{what} need {format_bytes(need)}, over the memory budget of {format_bytes(budget.nbytes)} "
                     f"({budget.source}){biggest}",
                     hint="bind smaller shapes with --shape, or raise the limit with --memory-budget SIZE")


def check_buffers(buffers: Iterable[tuple[str, str, int]], budget: Budget, what: str = "the run's buffers") -> int:
    """(role, name, nbytes) of everything a run allocates -> total bytes, or ShapeError naming the largest."""
    items = list(buffers)
    total = sum(n for _, _, n in items)
    largest = max(items, key=lambda t: t[2], default=None)
    if largest is not None and largest[2] > budget.nbytes:
        _refuse(f"{largest[0]} '{largest[1]}' alone would", largest[2], budget, None)
    if total > budget.nbytes:
        _refuse(what, total, budget, largest)
    return total


def graph_buffers(graph, backend: str = "reference") -> list[tuple[str, str, int]]:
    """What running `graph` on `backend` allocates, before any plan: inputs, constants and outputs,
    plus every stage's result for `reference` (it keeps them all) or the largest intermediate for the
    kernel backends (their arena holds at least that; `check_program_memory` checks the planned arena)."""
    outputs = set(graph.outputs)
    items = [("input", s.name, s.nbytes) for s in graph.inputs]
    items += [("constant", s.name, s.nbytes) for s in graph.constants]
    items += [("output", s.name, s.spec.nbytes) for s in graph.stages if s.name in outputs]
    inter = [("intermediate", s.name, s.spec.nbytes) for s in graph.stages if s.name not in outputs]
    if backend == "reference":
        items += inter
    elif inter:
        items.append(max(inter, key=lambda t: t[2]))
    return items


def check_graph_memory(graph, budget: Budget, backend: str = "reference") -> int:
    """Refuse a model whose run would not fit `budget` (checked before inputs are generated)."""
    return check_buffers(graph_buffers(graph, backend), budget, f"running {graph.name} on {backend}: the buffers")


def check_program_memory(program, specs: Mapping, budget: Budget) -> int:
    """Refuse a generated Program whose inputs, constants, outputs and arena would not fit `budget`
    (checked before `bind_buffers` or a device allocation)."""
    items = [("input", n, specs[n].nbytes) for n in program.inputs]
    items += [("constant", n, specs[n].nbytes) for n in program.constants]
    items += [("output", n, specs[n].nbytes) for n in program.outputs if n not in program.inputs]
    items.append(("arena", program.name, program.memory.arena_bytes))
    return check_buffers(items, budget, f"{program.name}: inputs, constants, outputs and the arena")
