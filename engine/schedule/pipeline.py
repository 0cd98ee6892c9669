"""Graph → (graph, Plan) as every front end plans: operator batching (Wolong) first when the plan asks for
it, then the policy; and a saved plan → (graph, Plan) that re-applies the same batching before loading."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from engine.device import Device
from engine.errors import PlanError
from engine.ir.graph import PrimGraph
from engine.schedule.plan import Edit, Plan, plan_from_json

BATCHING_PREFIX = "batching: "


def default_batching(policy: str) -> bool:
    """Operator batching is on by default for `welder` only (the tile-graph policy that fuses contractions)."""
    return policy == "welder"


def batch_graph(graph: PrimGraph) -> tuple[PrimGraph, tuple[str, ...]]:
    """The operator-batched graph and its decisions as plan-log lines (each with its reason)."""
    from engine.ir.batching import batch_contractions

    batched, found = batch_contractions(graph)
    return batched, tuple(f"{BATCHING_PREFIX}{d}" for d in found)


def plan_model(graph: PrimGraph, policy: str, device: Device | str, *, batching: bool | None = None,
               edits: Sequence[Edit] = (), options: Mapping | None = None,
               tune: int | None = None) -> tuple[PrimGraph, Plan]:
    """(graph, plan): `policy`'s plan of `graph`, made on the operator-batched graph when `batching`
    (default: on for welder). The plan records options["batching"] and its decision log starts with the
    batching decisions; generate and run the returned graph, not the one passed in. `tune` K: the top-K
    tile candidates of each kernel (and for welder the other policies' groupings) are timed on the device
    and the fastest kept (engine/schedule/tune.py)."""
    from engine.schedule.policies import gc_paused

    with gc_paused():
        return _plan_model(graph, policy, device, batching, edits, options, tune)


def _plan_model(graph: PrimGraph, policy: str, device: Device | str, batching: bool | None, edits: Sequence[Edit],
                options: Mapping | None, tune: int | None) -> tuple[PrimGraph, Plan]:
    from engine.codegen.generate import check_index_range
    from engine.schedule.policies import make_plan

    if tune is not None:
        from engine.schedule.tune import check_tune

        check_tune(tune)
    if isinstance(device, str):
        from engine.device import get_device

        device = get_device(device)

    check_index_range(graph)
    base = (options or {}).get("base_policy", policy) if policy == "user" else policy
    if batching is None:
        batching = default_batching(base)
    decisions: tuple[str, ...] = ()
    if batching:
        graph, decisions = batch_graph(graph)
    from engine.schedule import schedcache

    schedcache.load(device)  # the tile search's answers from earlier processes (engine/schedule/schedcache.py)
    plan = make_plan(graph, policy, device, edits=tuple(edits), options={**(options or {}), "batching": batching})
    if not edits and _tensor_cores_apply(graph, device, dict(plan.options)):
        plan = _at_least_the_fma_plan(graph, policy, device, plan)
    schedcache.save(device)
    if tune is not None:
        from engine.schedule.tune import tune_plan

        plan = tune_plan(graph, plan, device, tune)
    return graph, dataclasses.replace(plan, decisions=decisions + plan.decisions)


def _tensor_cores_apply(graph: PrimGraph, device, options: Mapping) -> bool:
    """Whether the plan's contractions may go on tensor cores (engine/codegen/mma.py): fp32 ones under the
    option tf32 on a TF32 device, fp16 / bf16 ones (a contraction loading fp16 / bf16 tensors) on a device
    with that mma.sync (`f16_mma`, `bf16_mma`) or TF32 (which holds fp16 and bf16 exactly)."""
    from engine.codegen.mma import bf16_mma, f16_mma
    from engine.ir import expr as E
    from engine.ir.dtypes import DType
    from engine.ir.graph import StageKind

    tf32 = "tf32" in device.tensor_precisions
    if options.get("tf32") and tf32:
        return True
    if not (tf32 or f16_mma(device) or bf16_mma(device)):
        return False
    return any(st.kind == StageKind.CONTRACTION and any(ld.dtype in (DType.F16, DType.BF16) for ld in E.loads(st.body))
               for st in graph.stages)


def _at_least_the_fma_plan(graph: PrimGraph, policy: str, device, plan: Plan) -> Plan:
    """`plan` (made with tensor cores: the option tf32, fp16 contractions), or the plan made without them
    re-costed with them where that models faster: the tile search and fusion are greedy, so cheaper GEMMs
    can lead them to a plan slower than the FMA plan's own groups and tiles on tensor cores (bert_layer with
    tf32: 87.5 against 68.6 µs on a100; fp16 gpt2 on h100: 198.9 against 113.9 µs). Tensor cores only make
    contractions cheaper, so the FMA plan is a candidate of the same options and device; it is taken only if
    it is legal under them. The FMA plan is made on the device with no tensor cores listed (its name kept)."""
    from engine.schedule.cost import estimate_group
    from engine.schedule.policies import make_plan
    from engine.schedule.residency import with_l2_residency
    from engine.schedule.validate import bounded, validate

    options = {k: v for k, v in plan.options if k != "tf32"}
    bare = dataclasses.replace(device, tensor_precisions=(), peak_tf32_tensor_flops=0.0)
    fp32 = make_plan(graph, policy, bare, options=options)
    conns = {e.key: e.conn for e in fp32.edges}
    with bounded(dict(plan.options)):
        groups = tuple(dataclasses.replace(g, cost=(c := estimate_group(graph, g.stages, conns, g.segments, device,
                                                                         exact=True, warm=g.cost.l2_warm)),
                                           score=c.modeled_us)
                       for g in fp32.groups)
    recosted = with_l2_residency(dataclasses.replace(fp32, groups=groups, options=plan.options), graph, device)
    if recosted.modeled_us >= plan.modeled_us or validate(recosted, graph, device):
        return plan
    why = (f"tensor cores: the FMA plan's groups and tiles on tensor cores model {recosted.modeled_us:.1f} us, "
           f"under the {plan.modeled_us:.1f} us of the plan searched with them: kept")
    return dataclasses.replace(recosted, decisions=recosted.decisions + (why,),
                               schedule_seconds=plan.schedule_seconds + fp32.schedule_seconds)


def plan_batching(plan: Plan) -> bool:
    """Whether `plan` was made on the operator-batched graph."""
    return bool(dict(plan.options).get("batching", False))


def batching_decisions(plan: Plan) -> tuple[str, ...]:
    """The batching lines of the plan's decision log, without their prefix."""
    return tuple(d.removeprefix(BATCHING_PREFIX) for d in plan.decisions if d.startswith(BATCHING_PREFIX))


def graph_for_plan(plan: Plan, graph: PrimGraph) -> PrimGraph:
    """The graph `plan` was made on: `graph` itself, or its batched form when the plan says batching and
    `graph` is the unbatched model (so a caller may pass either)."""
    if plan.model_hash == graph.structural_hash or not plan_batching(plan):
        return graph
    batched, _ = batch_graph(graph)
    return batched


def load_plan(source: str | Path | Mapping, graph: PrimGraph) -> tuple[PrimGraph, Plan]:
    """(graph, plan) from a saved plan (a JSON file, a kernel bundle .zip holding plan.json, or the plan's
    dict) for the model `graph`: the batching the plan was made with is re-applied before the model-hash
    check; PlanError (BundleError for a bundle) naming the file otherwise."""
    if isinstance(source, Mapping):
        data = dict(source)
    elif str(source).lower().endswith(".zip"):
        from engine.bundle.read import bundle_plan_json

        data = bundle_plan_json(source)  # a kernel bundle: its plan.json, after the bundle's safety checks
    else:
        try:
            data = json.loads(Path(source).read_text())
        except OSError as err:
            raise PlanError(f"{source}: cannot read plan file ({err.strerror})", hint="check the path") from None
        except json.JSONDecodeError as err:
            raise PlanError(f"{source}: not valid JSON ({err.msg} at line {err.lineno})") from None
        except RecursionError:
            raise PlanError(f"{source}: not a tileweave plan (JSON nested too deeply)") from None
        except UnicodeDecodeError:
            raise PlanError(f"{source}: not valid JSON (not UTF-8 text)") from None
    if not isinstance(data, dict):
        raise PlanError(f"{source if not isinstance(source, Mapping) else 'plan'}: not a tileweave plan "
                        "(JSON is not an object)", hint="save one with --plan-out")
    options = data.get("options")
    if isinstance(options, dict) and options.get("batching"):
        graph, _ = batch_graph(graph)
    return graph, plan_from_json(data, graph)
