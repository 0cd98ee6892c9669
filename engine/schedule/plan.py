"""The Plan: how a PrimGraph runs. Every stage-to-stage edge gets a connection level; kernel groups
are the connected components of non-KERNEL edges; each group has one or more tiled segments
(separated by grid barriers) with a block tile and a thread mapping; every automatic decision keeps
its reason and score; the user's edits are an ordered list replayed on a base policy.

Plain frozen data with a JSON round trip (schema version + model hash)."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from dataclasses import dataclass, field
from enum import StrEnum

from engine.errors import PlanError
from engine.ir.graph import PrimGraph
from engine.tilegraph.tilegraph import DisjointSets

SCHEMA_VERSION = 1


class Conn(StrEnum):
    REGISTER = "register"  # value stays in the consuming thread's registers (recomputed per use)
    SHARED = "shared"  # staged in a shared-memory tile of the block, block barrier
    GLOBAL_SYNC = "global_sync"  # device memory + grid barrier inside the same kernel
    KERNEL = "kernel"  # device memory, next kernel launch

    @property
    def fused(self) -> bool:
        return self != Conn.KERNEL


LEVEL_ORDER = (Conn.REGISTER, Conn.SHARED, Conn.GLOBAL_SYNC, Conn.KERNEL)


@dataclass(frozen=True)
class EdgePlan:
    producer: str
    consumer: str
    conn: Conn
    reason: str
    score: float | None = None
    source: str = "policy"  # "policy" or "user"

    @property
    def key(self) -> tuple[str, str]:
        return (self.producer, self.consumer)


@dataclass(frozen=True)
class Tile:
    """Block tile of one anchor stage's output and how threads cover it.

    A row is the innermost output axis (for reductions: the reduced row); `rows_per_block` rows are
    packed into one block with `threads_per_row` threads each; a long row may be split across
    `row_split` blocks. `reduce_step` is the k-tile of a contraction.

    `thread_shape`: how the block's threads cover the tile per output axis, where that is a choice. For a
    segment run as a tiled GEMM it is (ty, tx): ty thread rows over the GEMM's rows, tx (a power of two)
    over its columns, ty * tx == threads; each thread's micro-tile is ceil(bm / ty) x ceil(bn / tx)
    (`engine.codegen.generate.gemm_split`). Empty: the default for the tile and thread count (`micro_tile`;
    plan files from before the field, and segments without a GEMM — an elementwise or reduction tile's
    threads run a flat row-major loop over it, or `rows_per_block` x `threads_per_row`: one mapping, see
    docs/architecture.md "Thread mappings")."""

    stage: str
    shape: tuple[int, ...]
    threads: int
    blocks: int
    reduce_step: tuple[int, ...] = ()
    rows_per_block: int = 1
    threads_per_row: int = 1
    row_split: int = 1
    thread_shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class Candidate:
    tile: Tile
    score: float
    traffic_bytes: int
    waves: int


@dataclass(frozen=True)
class GroupCost:
    """Every term of the modeled time of one kernel (shown next to the decision it drove)."""

    footprint: dict  # level -> bytes: "register" (per thread), "shared" (per block)
    traffic_bytes: dict  # level -> bytes moved from the level below: "dram", "l2", "shared"
    transactions: dict  # level -> count (reads in 128 B lines, writes in 32 B sectors)
    flops: int
    recompute_factor: float  # flops incl. REGISTER recompute / flops of the stages once
    resident_blocks_per_sm: int
    occupancy_limiter: str
    waves: int
    wave_efficiency: float
    terms_us: dict  # "dram", "l2", "shared", "compute", "launch", "grid_barrier"
    modeled_us: float
    # Where footprint["register"] came from: "formula" (the model's estimate from the kernel IR) or the
    # compiled kernel, e.g. "sm_90 CUBIN" (`cost.at_compiled_registers`, once NVRTC has built it).
    registers_from: str = "formula"
    # Inputs this kernel finds whole in L2, left there by earlier kernels of the program (GPU presets:
    # engine/schedule/residency.py): read from L2, not DRAM. Modeled, not measured on a GPU yet.
    l2_warm: tuple[str, ...] = ()
    l2_warm_bytes: int = 0  # DRAM bytes those reads would cost with caches cold (as ncu replays one kernel)
    # Element evaluations past once per stage, summed over the kernel's stages (REGISTER recompute, halos and
    # broadcasts of overlapping tiles, rows split across blocks; unweighted by a stage's flops, so a layout
    # stage's re-reads count too); None in plans written before it was recorded.
    extra_evaluations: int | None = None
    serial_segments: int = 0  # CPU, several threads: segments the C target runs on one thread (`cost.serial_on`)


@dataclass(frozen=True)
class Group:
    id: int
    name: str  # kernel name, deterministic: k03_matmul_add_gelu
    stages: tuple[str, ...]  # topological order
    segments: tuple[Tile, ...]  # one tile per segment; segments separated by grid barriers
    reason: str
    score: float | None = None
    candidates: tuple[Candidate, ...] = ()
    cost: GroupCost | None = None
    measured_us: float | None = None  # timed on the plan's device by --tune (engine/schedule/tune.py)

    @property
    def threads(self) -> int:
        return max(t.threads for t in self.segments)

    @property
    def blocks(self) -> int:
        return max(t.blocks for t in self.segments)


EDIT_KINDS = ("set_edge", "split", "merge", "set_tile")


@dataclass(frozen=True)
class Edit:
    """One user edit. kinds: set_edge(producer, consumer, conn), split(producer, consumer),
    merge(producer, consumer, conn?), set_tile(stage, shape, threads, reduce_step?, thread_shape?)."""

    kind: str
    args: tuple[tuple[str, object], ...]

    @staticmethod
    def make(kind: str, **args) -> Edit:
        return Edit(kind, tuple(sorted((k, _freeze(v)) for k, v in args.items())))

    @property
    def arg(self) -> dict:
        return dict(self.args)


def _freeze(v):
    return tuple(_freeze(x) for x in v) if isinstance(v, list | tuple) else v


@dataclass(frozen=True)
class Plan:
    model_hash: str
    model_name: str
    policy: str  # unfused | elementwise | stitch | welder | user
    device: str
    edges: tuple[EdgePlan, ...]
    groups: tuple[Group, ...]
    base_policy: str = ""
    edits: tuple[Edit, ...] = ()
    decisions: tuple[str, ...] = ()  # log of every automatic decision with its reason
    schedule_seconds: float = 0.0
    schema: int = SCHEMA_VERSION
    options: tuple[tuple[str, object], ...] = ()

    # ---- lookups ------------------------------------------------------------------------
    def edge(self, producer: str, consumer: str) -> EdgePlan:
        for e in self.edges:
            if e.producer == producer and e.consumer == consumer:
                return e
        raise PlanError(f"no edge {producer} -> {consumer} in this plan")

    def group_of(self, stage: str) -> Group:
        for g in self.groups:
            if stage in g.stages:
                return g
        raise PlanError(f"stage '{stage}' is in no group")

    @property
    def kernels(self) -> int:
        return len(self.groups)

    @property
    def modeled_us(self) -> float:
        return sum(g.cost.modeled_us for g in self.groups if g.cost)

    @property
    def measured_us(self) -> float | None:
        """Sum of the kernels' times measured by --tune, None when any was not measured."""
        times = [g.measured_us for g in self.groups]
        return sum(times) if times and all(t is not None for t in times) else None

    @property
    def dram_bytes(self) -> int:
        return sum(int(g.cost.traffic_bytes.get("dram", 0)) for g in self.groups if g.cost)

    @property
    def dram_bytes_cold(self) -> int:
        """DRAM bytes with every kernel's caches cold at its start (Nsight Compute's per-kernel replay):
        `dram_bytes` plus the reads the L2 residency model serves from L2 (`GroupCost.l2_warm_bytes`)."""
        return self.dram_bytes + sum(int(g.cost.l2_warm_bytes) for g in self.groups if g.cost)

    @property
    def plan_hash(self) -> str:
        return hashlib.sha256(json.dumps(plan_to_json(self), sort_keys=True).encode()).hexdigest()[:16]


def components(graph: PrimGraph, conns: dict[tuple[str, str], Conn]) -> list[list[str]]:
    """Kernel groups: connected components of the non-KERNEL edges, each in stage order, the
    list ordered by each group's first stage."""
    sets = DisjointSets([s.name for s in graph.stages])
    for (p, c), conn in conns.items():
        if conn.fused:
            sets.union(p, c)
    return sets.groups(graph, [s.name for s in graph.stages])


def kernel_name(index: int, graph: PrimGraph, stages: list[str] | tuple[str, ...], limit: int = 4) -> str:
    """k03_matmul_add_gelu: group index and the distinct op labels of its stages in order."""
    ops: list[str] = []
    for s in stages:
        label = (graph.stage(s).op or graph.stage(s).kind.value).split(".")[0]
        label = "".join(ch if ch.isalnum() else "_" for ch in label.lower())
        if label not in ops:
            ops.append(label)
    more = "_etc" if len(ops) > limit else ""
    return f"k{index:02d}_" + "_".join(ops[:limit]) + more


# ---- JSON -----------------------------------------------------------------------------------


def _obj(x):
    if dataclasses.is_dataclass(x):
        return {f.name: _obj(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, StrEnum):
        return x.value
    if isinstance(x, tuple | list):
        return [_obj(v) for v in x]
    if isinstance(x, dict):
        return {k: _obj(v) for k, v in x.items()}
    return x


def plan_to_json(plan: Plan) -> dict:
    out = _obj(plan)
    out["edits"] = [{"kind": e.kind, "args": {k: _obj(v) for k, v in e.args}} for e in plan.edits]
    out["options"] = {k: _obj(v) for k, v in plan.options}
    return out


_TILE_INTS = ("threads", "blocks", "rows_per_block", "threads_per_row", "row_split")
_TILE_MAX = 1 << 31  # kernels index with 32-bit ints: no tile extent, thread or block count goes past it


def _tile(d: dict) -> Tile:
    tile = Tile(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
    if not isinstance(tile.stage, str):
        raise ValueError(f"tile stage must be a name, got {tile.stage!r}")
    for key in _TILE_INTS:
        _check_count(f"tile of '{tile.stage}': {key}", getattr(tile, key))
    for key in ("shape", "reduce_step", "thread_shape"):
        value = getattr(tile, key)
        if not isinstance(value, tuple):
            raise ValueError(f"tile of '{tile.stage}': {key} must be a list of integers, got {value!r}")
        for v in value:
            _check_count(f"tile of '{tile.stage}': {key}", v)
    return tile


def _check_count(what: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < _TILE_MAX:
        raise ValueError(f"{what} must be an integer in 1..{_TILE_MAX - 1}, got {value!r}")


def plan_from_json(d: dict, graph: PrimGraph | None = None) -> Plan:
    """Rebuild a Plan; with `graph`, refuse a plan made for another model."""
    if not isinstance(d, dict) or "schema" not in d:
        raise PlanError("not a tileweave plan (no 'schema' field)", hint="save one with --plan-out")
    if d["schema"] != SCHEMA_VERSION:
        raise PlanError(f"plan schema version {d['schema']} is not supported (this tileweave reads "
                        f"version {SCHEMA_VERSION})", hint="re-create the plan with this version")
    unknown = sorted(set(d) - _PLAN_KEYS)
    if unknown:
        close = difflib.get_close_matches(unknown[0], _PLAN_KEYS, n=1)
        raise PlanError(f"plan has unknown key '{unknown[0]}'",
                        hint=f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(_PLAN_KEYS))}")
    if graph is not None and d.get("model_hash") != graph.structural_hash:
        raise PlanError(f"plan was made for model '{d.get('model_name')}' (hash {d.get('model_hash')}), not "
                        f"this one (hash {graph.structural_hash})", hint="plan this model instead")
    try:
        edges = tuple(EdgePlan(e["producer"], e["consumer"], Conn(e["conn"]), e["reason"], e.get("score"),
                               e.get("source", "policy")) for e in d["edges"])
        groups = tuple(_group(g) for g in d["groups"])
        edits = tuple(Edit.make(e["kind"], **e["args"]) for e in d.get("edits", []))
        unknown = next((e.kind for e in edits if e.kind not in EDIT_KINDS), None)
        if unknown is not None:
            raise PlanError(f"plan has an edit of unknown kind {unknown!r}", hint=f"use one of {', '.join(EDIT_KINDS)}")
        return Plan(
            model_hash=d["model_hash"], model_name=d["model_name"], policy=d["policy"], device=d["device"],
            edges=edges, groups=groups, base_policy=d.get("base_policy", ""), edits=edits,
            decisions=tuple(d.get("decisions", ())), schedule_seconds=_seconds(d.get("schedule_seconds", 0.0)),
            options=tuple(sorted((k, _freeze(v)) for k, v in d.get("options", {}).items())),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise PlanError(f"malformed plan JSON ({type(err).__name__}: {err})",
                        hint="re-create the plan with --plan-out") from None


def _seconds(value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise ValueError(f"schedule_seconds must be a finite number >= 0, got {value!r}")
    return float(value)


_PLAN_KEYS = frozenset(f.name for f in dataclasses.fields(Plan))


def _group(g: dict) -> Group:
    cost = g.get("cost")
    return Group(
        id=g["id"], name=g["name"], stages=tuple(g["stages"]),
        segments=tuple(_tile(t) for t in g["segments"]), reason=g["reason"], score=g.get("score"),
        candidates=tuple(Candidate(_tile(c["tile"]), c["score"], c["traffic_bytes"], c["waves"])
                         for c in g.get("candidates", ())),
        cost=GroupCost(**{**cost, "l2_warm": tuple(cost.get("l2_warm", ()))}) if cost else None,
        measured_us=_measured(g.get("measured_us")),
    )


def _measured(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise ValueError(f"measured_us must be a finite number >= 0, got {value!r}")
    return float(value)


@dataclass
class PlanBuilder:
    """Mutable helper policies use: set edge connections with reasons, then freeze."""

    graph: PrimGraph
    conns: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)
    scores: dict = field(default_factory=dict)
    decisions: list = field(default_factory=list)

    def set(self, producer: str, consumer: str, conn: Conn, reason: str, score: float | None = None) -> None:
        self.conns[(producer, consumer)] = conn
        self.reasons[(producer, consumer)] = reason
        self.scores[(producer, consumer)] = score
        self.decisions.append(f"{producer} -> {consumer}: {conn.value} ({reason})")

    def edges(self) -> tuple[EdgePlan, ...]:
        out = []
        for p, c in self.graph.edges:
            conn = self.conns.get((p, c), Conn.KERNEL)
            out.append(EdgePlan(p, c, conn, self.reasons.get((p, c), "default: separate kernels"),
                                self.scores.get((p, c))))
        return tuple(out)
