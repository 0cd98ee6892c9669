"""The edit fuzzer (issue 15 item 4): random edit sequences (set_edge at every level, split, merge, set_tile)
on a base plan with operator batching on or off, for one of four devices; each edit is applied (the plan validates) or refused
with a named rule; sampled final plans run on the CPU backend (or cuda-sim) against onnxruntime.
Used by tests/engine/schedule/test_edits.py and tests/data/reliability_report.py."""

from __future__ import annotations

import functools
import re
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from hypothesis import strategies as st

from engine.device import Device, get_device
from engine.errors import PlanError
from engine.ir.graph import PrimGraph
from engine.schedule.pipeline import plan_model
from engine.schedule.plan import EDIT_KINDS, Conn, Edit, Plan
from engine.schedule.validate import RULES, validate

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))
from sched_graphs import attention_model, qkv_model  # noqa: E402

# Two scheduler graphs (attention: GEMM + softmax; qkv: three projections that operator batching joins)
# and three small bundled samples (elementwise chain, masked softmax, layernorm with residual).
GRAPHS = ("attn", "qkv", "gelu_chain", "masked_softmax", "layernorm_residual")
# Refusals that are not a validate() Violation but still name what is wrong in one line (edits.py).
NAMED_REFUSALS = ("anchors no segment", "illegal at every level", "does not fit the rank",
                  "shared-memory budget allows")
TOL = 1e-3  # max |got - want| / max |want|, fp32 (as tests/engine/runtime/test_cpu.py)
TILE_DIMS = (1, 2, 4, 8, 16, 32, 64, 128, 1024)


@functools.cache
def load_fuzz_model(name: str) -> tuple[bytes, PrimGraph]:
    """(ONNX bytes, PrimGraph) of one fuzz graph."""
    from engine.frontend.importer import load_graph

    if name in ("attn", "qkv"):
        model = attention_model() if name == "attn" else qkv_model()
        model.ir_version = 8  # onnx's newest IR version can be past what onnxruntime reads; opset 17 needs 8
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{name}.onnx"
            onnx.save(model, path)
            return model.SerializeToString(), load_graph(path)
    path = ROOT / "samples" / f"{name}.onnx"
    return path.read_bytes(), load_graph(path)


@functools.cache
def oracle(name: str, seed: int = 7) -> tuple[dict, dict]:
    """Random inputs (normal floats, mostly-true masks; never zeros) and onnxruntime's outputs."""
    import onnxruntime as ort

    data, graph = load_fuzz_model(name)
    from support import random_feeds

    feeds = random_feeds(graph, seed)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return feeds, dict(zip(names, sess.run(names, feeds)))


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    want = np.asarray(want, np.float64)
    scale = max(float(np.abs(want).max()), 1e-30) if want.size else 1.0
    return float(np.abs(np.asarray(got, np.float64) - want).max()) / scale if want.size else 0.0


# One step: (kind, pick, conn, tile dims, threads, anchored, reduce step, threads per row). `pick` indexes
# the graph's edges or stages modulo their count; `anchored` makes a set_tile aim at a stage that anchors a
# segment of the current plan (the only stages whose tile can be set) rather than at any stage; the
# optional set_tile arguments are left out when drawn as 0.
step_st = st.tuples(
    st.sampled_from(EDIT_KINDS), st.integers(0, 1 << 16), st.sampled_from([c.value for c in Conn]),
    st.lists(st.sampled_from(TILE_DIMS), min_size=4, max_size=4), st.sampled_from([32, 64, 128, 256, 1024, 2048]),
    st.booleans(), st.sampled_from([0, 0, 1, 4, 16, 32, 64]), st.sampled_from([0, 0, 1, 2, 8, 32, 128]),
)
sequence_st = st.fixed_dictionaries({
    "graph": st.sampled_from(GRAPHS), "base": st.sampled_from(["unfused", "stitch", "welder"]),
    "batching": st.booleans(), "steps": st.lists(step_st, min_size=1, max_size=5),
    "device": st.sampled_from(["", "v100", "rtx3090", "h100"]),  # "": the caller's device
})


def make_edit(plan: Plan, graph: PrimGraph, step: tuple) -> Edit:
    kind, pick, conn, dims, threads, anchored, step_k, per_row = step
    if kind == "set_tile":
        anchors = sorted({t.stage for g in plan.groups for t in g.segments})
        names = anchors if anchored and anchors else [s.name for s in graph.stages]
        stage = graph.stage(names[pick % len(names)])
        shape = [min(d, n) if anchored else d for d, n in zip(dims, stage.shape)]
        extra = {"reduce_step": [step_k] * len(stage.reduce)} if step_k and stage.reduce else {}
        extra |= {"threads_per_row": per_row} if per_row else {}
        return Edit.make("set_tile", stage=stage.name, shape=shape, threads=threads, **extra)
    p, c = graph.edges[pick % len(graph.edges)]
    return Edit.make(kind, producer=p, consumer=c, **({"conn": conn} if kind == "set_edge" else {}))


def refusal_rule(err: PlanError) -> str | None:
    """The rule a refusal names: a validate() rule `(name)` or one of NAMED_REFUSALS; None if neither."""
    text = str(err)
    if "\n" in text:
        return None
    found = [r for r in re.findall(r"\(([a-z_0-9]+)\)", text) if r in RULES]
    if found:
        return found[0]
    return next((n for n in NAMED_REFUSALS if n in text), None)


@dataclass
class Tally:
    applied: int = 0
    refused: Counter = field(default_factory=Counter)  # rule -> count
    unnamed: list = field(default_factory=list)  # refusals naming no rule (a defect)
    runs: Counter = field(default_factory=Counter)  # (target, "pass"/"fail") -> count
    failures: list = field(default_factory=list)  # one line per mismatching run
    graphs: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)  # edit kind -> applied count

    @property
    def edits(self) -> int:
        return self.applied + sum(self.refused.values()) + len(self.unnamed)

    @property
    def applied_share(self) -> float:
        return self.applied / max(1, self.edits)


def fuzz_sequence(seq: dict, device: Device, tally: Tally, targets: tuple[str, ...] = ()) -> Plan:
    """Apply `seq`'s edits in order, recording each outcome in `tally`; run the final plan on `targets`
    (when at least one edit applied) and compare with onnxruntime. Returns the final plan."""
    from engine.schedule.edits import apply_edit

    name = seq["graph"]
    device = get_device(seq["device"]) if seq.get("device") else device
    _, graph0 = load_fuzz_model(name)
    graph, plan = plan_model(graph0, seq["base"], device, batching=seq["batching"])
    tally.graphs[name] += 1
    for step in seq["steps"]:
        edit = make_edit(plan, graph, step)
        try:
            plan = apply_edit(plan, graph, device, edit)
        except PlanError as err:
            rule = refusal_rule(err)
            if rule is None:
                tally.unnamed.append(f"{name}: {err}")
            else:
                tally.refused[rule] += 1
            continue
        tally.applied += 1
        tally.kinds[edit.kind] += 1
        assert plan.edits[-1] == edit
        assert validate(plan, graph, device) == [], (name, edit)
    if any(e.source == "user" for e in plan.edges) or any(e.kind == "set_tile" for e in plan.edits):
        for target in targets:
            check_outputs(name, graph, plan, target, tally)
    return plan


def check_outputs(name: str, graph: PrimGraph, plan: Plan, target: str, tally: Tally) -> None:
    from engine.runtime.execute import run_model

    feeds, want = oracle(name)
    out = run_model(graph, feeds, backend=target, plan=plan, device=plan.device).outputs
    errs = {k: rel_error(out[k], v) for k, v in want.items()}
    ok = all(e <= TOL for e in errs.values())
    tally.runs[target, "pass" if ok else "fail"] += 1
    if not ok:
        tally.failures.append(f"{target} {name} edits={[e.args for e in plan.edits]} errors={errs}")
