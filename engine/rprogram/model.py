"""The rProgram data model (Rammer): rOperators (kernels) made of rTasks (thread blocks), the vDevice of
vEUs they run on, and the RProgram value `veus[vEU] = [(rtask, start, end)]` with its JSON round trip."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.device import Device, resident_blocks_per_sm
from engine.errors import TileweaveError

SCHEMA_VERSION = 1
MODELED = "modeled"
MEASURED = "measured"


class RProgramError(TileweaveError):
    """An rProgram that cannot be built, read or exported (bad plan, schema, or timeline)."""


@dataclass(frozen=True)
class Variant:
    """One way to run a kernel: its grid and block shape and the duration of each of its rTasks.

    Variant 0 is the tile the scheduler chose; the others come from the group's top-k candidates."""

    blocks: int
    threads: int
    shared_bytes: int
    regs_per_thread: int
    task_us: float  # duration of one rTask (thread block) on one vEU
    source: str  # "modeled", "measured", or "modeled (scaled from ...)" for a candidate tile
    tile: tuple[int, ...] = ()
    # The rest of the Tile, so a plan can be rewritten to run the chosen variant (plan_for_rprogram).
    reduce_step: tuple[int, ...] = ()
    rows_per_block: int = 1
    threads_per_row: int = 1
    row_split: int = 1
    origin: str = "plan"  # "plan" (the chosen tile), "candidate" (scheduler's top-k), "split" (finer tile)
    thread_shape: tuple[int, ...] = ()  # the tile's thread mapping (Tile.thread_shape)

    @property
    def busy_us(self) -> float:
        """vEU-time the whole kernel occupies: the resource-efficiency measure of a variant."""
        return self.blocks * self.task_us


@dataclass(frozen=True)
class ROperator:
    """One kernel of the program. `deps` names the rOperators whose outputs it reads: every rTask of
    this operator waits until every rTask of those has ended (the stage edge may read any block)."""

    name: str
    group: int
    stages: tuple[str, ...]
    variants: tuple[Variant, ...]
    deps: tuple[str, ...] = ()
    kernel_us: float = 0.0  # the kernel on its own, launch excluded (sequential two-layer execution)


@dataclass(frozen=True)
class RTask:
    """Block `block` of rOperator `op`, placed on a vEU from `start_us` to `end_us`."""

    op: str
    block: int
    start_us: float
    end_us: float

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class VDevice:
    """Virtual device: `sm_count × slots` vEUs, `slots` being the blocks resident per SM for the largest
    resources any rTask asks for (so one persistent block per vEU is always co-resident)."""

    device: str
    sm_count: int
    slots: int
    limiter: str
    threads: int
    shared_bytes: int
    regs_per_thread: int

    @property
    def veus(self) -> int:
        return self.sm_count * self.slots


def make_vdevice(device: Device, threads: int, shared_bytes: int, regs_per_thread: int = 0) -> VDevice:
    """vDevice for blocks of this size; RProgramError when such a block cannot be resident at all."""
    slots, limiter = resident_blocks_per_sm(device, threads, regs_per_thread, shared_bytes)
    if slots <= 0:
        raise RProgramError(f"no rTask of {threads} threads, {shared_bytes} B shared memory fits on a "
                            f"{device.name} SM ({limiter})", hint="choose smaller tiles for that kernel")
    return VDevice(device.name, device.sm_count, slots, limiter, threads, shared_bytes, regs_per_thread)


@dataclass(frozen=True)
class Step:
    """Consecutive BFS waves of the kernel DAG run between two grid barriers, and why they merged."""

    index: int
    waves: tuple[int, ...]
    ops: tuple[str, ...]
    variants: tuple[int, ...]  # chosen variant per op
    start_us: float
    end_us: float
    reason: str


@dataclass(frozen=True)
class RProgram:
    """A static schedule: per vEU, its rTasks in order. Times are µs from the single launch."""

    model_name: str
    policy: str  # the Plan's policy (welder, unfused, ...)
    vdevice: VDevice
    operators: tuple[ROperator, ...]
    veus: tuple[tuple[RTask, ...], ...]
    steps: tuple[Step, ...]
    launch_us: float  # one launch for the whole rProgram
    barrier_us: float  # grid barrier between steps
    sync_us: float  # dependency-counter wait before an rTask whose inputs come from the same step
    sequential_us: float  # sum of kernel times + one launch overhead each
    schema: int = SCHEMA_VERSION

    # ---- lookups ------------------------------------------------------------------------
    def operator(self, name: str) -> ROperator:
        for op in self.operators:
            if op.name == name:
                return op
        raise RProgramError(f"no rOperator named {name!r} in this rProgram")

    def chosen(self, name: str) -> Variant:
        """The variant the schedule picked for rOperator `name`."""
        for step in self.steps:
            if name in step.ops:
                return self.operator(name).variants[step.variants[step.ops.index(name)]]
        raise RProgramError(f"rOperator {name!r} is in no step")

    @property
    def span_us(self) -> float:
        return max((t.end_us for tasks in self.veus for t in tasks), default=0.0)

    @property
    def makespan_us(self) -> float:
        return self.launch_us + self.span_us

    @property
    def busy_us(self) -> float:
        return sum(t.dur_us for tasks in self.veus for t in tasks)

    @property
    def utilization(self) -> float:
        """busy vEU-time / (vEUs × makespan)."""
        total = self.vdevice.veus * self.makespan_us
        return self.busy_us / total if total > 0 else 0.0

    @property
    def speedup(self) -> float:
        return self.sequential_us / self.makespan_us if self.makespan_us > 0 else 0.0

    @property
    def critical_path_us(self) -> float:
        """Longest dependency chain of kernels, each at its chosen variant alone on the vDevice, plus the
        launch: no schedule of these rTasks can end sooner, whatever the placement."""
        done: dict[str, float] = {}
        pending = list(self.operators)
        while pending:
            ready = [op for op in pending if all(d in done for d in op.deps)]
            if not ready:
                raise RProgramError("the rOperators' dependencies form a cycle")
            for op in ready:
                v = self.chosen(op.name)
                alone = -(-v.blocks // self.vdevice.veus) * v.task_us
                done[op.name] = max((done[d] for d in op.deps), default=0.0) + alone
            pending = [op for op in pending if op.name not in done]
        return self.launch_us + max(done.values(), default=0.0)

    @property
    def sequential_same_tiles_us(self) -> float:
        """Sequential execution of the kernels at the tiles the rProgram chose (each alone on the
        vDevice, plus a launch each): separates the gain of better tiles from the gain of co-scheduling."""
        return sum(self.launch_us + -(-self.chosen(op.name).blocks // self.vdevice.veus) * self.chosen(op.name).task_us
                   for op in self.operators)

    @property
    def tasks(self) -> int:
        return sum(len(t) for t in self.veus)

    def summary(self) -> dict:
        """The numbers the CLI prints and the benchmark records."""
        return {
            "model": self.model_name, "policy": self.policy, "device": self.vdevice.device,
            "makespan_us": round(self.makespan_us, 3), "sequential_us": round(self.sequential_us, 3),
            "speedup": round(self.speedup, 3), "utilization": round(self.utilization, 4),
            "critical_path_us": round(self.critical_path_us, 3),
            "sequential_same_tiles_us": round(self.sequential_same_tiles_us, 3),
            "waves": max((w for s in self.steps for w in s.waves), default=-1) + 1,
            "steps": len(self.steps), "veus": self.vdevice.veus, "slots_per_sm": self.vdevice.slots,
            "kernels": len(self.operators), "rtasks": self.tasks,
        }


# ---- JSON -----------------------------------------------------------------------------------


def rprogram_to_json(rp: RProgram) -> dict:
    """Plain JSON-ready dict; rTasks as [op, block, start, end] rows to keep big programs compact."""
    out = {f.name: getattr(rp, f.name) for f in dataclasses.fields(rp)}
    out["vdevice"] = dataclasses.asdict(rp.vdevice)
    out["operators"] = [dataclasses.asdict(op) for op in rp.operators]
    out["steps"] = [dataclasses.asdict(s) for s in rp.steps]
    out["veus"] = [[[t.op, t.block, t.start_us, t.end_us] for t in tasks] for tasks in rp.veus]
    return _lists(out)


def _lists(x):
    if isinstance(x, dict):
        return {k: _lists(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_lists(v) for v in x]
    return x


def rprogram_from_json(d: dict) -> RProgram:
    """Inverse of `rprogram_to_json`; RProgramError on anything else."""
    if not isinstance(d, dict) or "schema" not in d:
        raise RProgramError("not a tileweave rProgram (no 'schema' field)",
                            hint="write one with `tileweave rprogram MODEL --json`")
    if d["schema"] != SCHEMA_VERSION:
        raise RProgramError(f"rProgram schema version {d['schema']} is not supported (this tileweave reads "
                            f"version {SCHEMA_VERSION})", hint="re-create it with this version")
    try:
        ops = tuple(
            ROperator(o["name"], o["group"], tuple(o["stages"]),
                      tuple(Variant(**{**v, "tile": tuple(v["tile"]), "reduce_step": tuple(v["reduce_step"]),
                                            "thread_shape": tuple(v.get("thread_shape", ()))})
                            for v in o["variants"]),
                      tuple(o["deps"]), o["kernel_us"])
            for o in d["operators"]
        )
        steps = tuple(Step(s["index"], tuple(s["waves"]), tuple(s["ops"]), tuple(s["variants"]),
                           s["start_us"], s["end_us"], s["reason"]) for s in d["steps"])
        veus = tuple(tuple(RTask(op, int(b), float(s), float(e)) for op, b, s, e in tasks) for tasks in d["veus"])
        return RProgram(
            model_name=d["model_name"], policy=d["policy"], vdevice=VDevice(**d["vdevice"]), operators=ops,
            veus=veus, steps=steps, launch_us=d["launch_us"], barrier_us=d["barrier_us"],
            sync_us=d["sync_us"], sequential_us=d["sequential_us"], schema=d["schema"],
        )
    except (KeyError, TypeError, ValueError) as err:
        raise RProgramError(f"malformed rProgram JSON ({type(err).__name__}: {err})",
                            hint="re-create it with `tileweave rprogram MODEL --json`") from None
