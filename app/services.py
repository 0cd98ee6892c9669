"""The only module of the app that calls the engine. Model → PrimGraph, (graph, policy, device, edits)
→ Plan, plan → outputs/profile/rProgram, each cached on (model hash, plan hash). Capabilities the
engine build does not offer yet are reported, never guessed at."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import streamlit as st

import engine.api as api
from engine.device import PRESETS, get_device
from engine.errors import PlanError, TileweaveError
from engine.flags import cache_dir
from engine.ir.graph import PrimGraph
from engine.schedule.plan import (
    Conn,
    Edit,
    Group,
    Plan,
    Tile,
    components,
    kernel_name,
    plan_from_json,
    plan_to_json,
)

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
UPLOAD_LIMIT_MB = 50
MATCH_TOLERANCE = 1e-3  # max rel err (max |got - ref| / max |ref|) for "matches reference"
NOT_AVAILABLE = "not available in this build yet"


class AppError(TileweaveError):
    """Bad input given through the app (an upload that is too large, a file that is not JSON)."""


# ---- models ----------------------------------------------------------------------------------


def catalog() -> list[dict]:
    return json.loads((SAMPLES / "catalog.json").read_text())


def default_sample() -> dict:
    entries = catalog()
    return next((e for e in entries if e.get("default")), entries[0])


def sample_path(name: str) -> Path:
    for e in catalog():
        if e["name"] == name:
            return SAMPLES / e["file"]
    raise AppError(f"no bundled sample named '{name}'", hint="pick one from the list")


def file_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def save_upload(filename: str, data: bytes) -> Path:
    """Store an uploaded .onnx under the cache folder, named by content hash."""
    if len(data) > UPLOAD_LIMIT_MB * 1024 * 1024:
        raise AppError(f"'{filename}' is {len(data) / 2**20:.1f} MiB, over the {UPLOAD_LIMIT_MB} MiB upload limit",
                       hint="use the CLI for larger models")
    if not filename.lower().endswith(".onnx"):
        raise AppError(f"'{filename}' is not an .onnx file", hint="upload an ONNX model")
    folder = cache_dir() / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(data).hexdigest()[:16]}_{Path(filename).name}"
    if not path.exists():
        path.write_bytes(data)
    return path


@dataclass(frozen=True)
class LoadedModel:
    graph: PrimGraph
    onnx_ops: dict = field(compare=False, hash=False)


@st.cache_resource(show_spinner=False, max_entries=8)
def load_model(path: str, digest: str) -> LoadedModel:
    """Import and lower a model file; `digest` (file content hash) is the cache key."""
    graph = api.import_onnx(path)
    return LoadedModel(api.lower(graph), dict(graph.onnx_ops))


# ---- capabilities ----------------------------------------------------------------------------


def devices() -> list[str]:
    return list(PRESETS)


@st.cache_resource(show_spinner=False)
def cuda_status() -> tuple[bool, str]:
    from engine.runtime.cuda_driver import cuda_available

    return cuda_available()


def policies() -> list[str]:
    names = engine_fn("POLICIES")
    if names:
        return [p for p in names if p != "user"]
    return ["unfused", "elementwise", "stitch", "welder"] if available("make_plan") else ["unfused"]


def default_policy() -> str:
    names = policies()
    return "welder" if "welder" in names else names[0]


# ---- plans -----------------------------------------------------------------------------------


def unfused_plan(graph: PrimGraph, device: str) -> Plan:
    """Every edge KERNEL, one group per stage: what the app shows until the engine's policies land."""
    from engine.schedule.plan import PlanBuilder

    builder = PlanBuilder(graph)
    groups = []
    for k, names in enumerate(components(graph, {})):
        stage = graph.stage(names[-1])
        threads = max(1, min(256, stage.size))
        tile = Tile(stage.name, stage.shape, threads, -(-stage.size // threads))
        groups.append(Group(k, kernel_name(k, graph, names), tuple(names), (tile,),
                            "unfused: every stage is its own kernel"))
    return Plan(graph.structural_hash, graph.name, "unfused", device, builder.edges(), tuple(groups),
                base_policy="unfused")


def base_plan(graph: PrimGraph, policy: str, device: str) -> Plan:
    make_plan = engine_fn("make_plan")
    if make_plan is not None:
        return make_plan(graph, policy, get_device(device))
    if policy != "unfused":
        raise PlanError(f"policy '{policy}' is {NOT_AVAILABLE}", hint="use the unfused policy")
    return unfused_plan(graph, device)


def editing_available() -> bool:
    return available("make_plan") and available("replay")


def plan_with_edits(graph: PrimGraph, policy: str, device: str, edits: tuple[Edit, ...]) -> Plan:
    """The policy's plan with `edits` replayed and validated, or PlanError naming the rule broken."""
    if not edits:
        return base_plan(graph, policy, device)
    if not editing_available():
        raise PlanError(f"plan editing is {NOT_AVAILABLE}")
    return engine_fn("make_plan")(graph, policy, get_device(device), edits=tuple(edits))


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    refused: tuple[tuple[int, str], ...] = ()  # (edit index, reason) for edits that no longer apply
    seconds: float = 0.0


def edits_key(edits: tuple[Edit, ...]) -> str:
    return json.dumps([edit_to_json(e) for e in edits], sort_keys=True)


@st.cache_resource(show_spinner=False, max_entries=64)
def build_plan(_graph: PrimGraph, model_hash: str, policy: str, device: str, key: str) -> PlanResult:
    """Base policy plan with the edits of `key` replayed in order. When the whole list is refused
    (e.g. the base policy changed under it), edits are re-tried one by one: refused ones are
    reported and skipped so the others still apply."""
    start = time.perf_counter()
    edits = edits_from_json(json.loads(key))
    try:
        return PlanResult(plan_with_edits(_graph, policy, device, edits), (), time.perf_counter() - start)
    except TileweaveError:
        pass
    kept: list[Edit] = []
    refused = []
    for k, edit in enumerate(edits):
        try:
            plan_with_edits(_graph, policy, device, tuple(kept + [edit]))
            kept.append(edit)
        except TileweaveError as err:
            refused.append((k, str(err)))
    plan = plan_with_edits(_graph, policy, device, tuple(kept))
    return PlanResult(plan, tuple(refused), time.perf_counter() - start)


def edit_to_json(edit: Edit) -> dict:
    return {"kind": edit.kind, "args": {k: list(v) if isinstance(v, tuple) else v for k, v in edit.args}}


def edits_from_json(items: list) -> tuple[Edit, ...]:
    try:
        return tuple(Edit.make(d["kind"], **d["args"]) for d in items)
    except (KeyError, TypeError, AttributeError) as err:
        raise AppError(f"malformed edit list ({type(err).__name__}: {err})", hint="delete the saved edits") from None


def edits_file(model_hash: str) -> Path:
    folder = cache_dir() / "edits"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{model_hash}.json"


def save_edits(model_hash: str, policy: str, edits: tuple[Edit, ...]) -> Path:
    """Autosave: the edit list and its base policy for this model."""
    path = edits_file(model_hash)
    path.write_text(json.dumps({"base_policy": policy, "edits": [edit_to_json(e) for e in edits]}, indent=1))
    return path


def load_edits(model_hash: str) -> tuple[str, tuple[Edit, ...]] | None:
    path = edits_file(model_hash)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return str(data.get("base_policy", "")), edits_from_json(data.get("edits", []))
    except (json.JSONDecodeError, AppError, AttributeError):
        return None  # a corrupt autosave must not lock the user out of the model


def plan_json_text(plan: Plan) -> str:
    return json.dumps(plan_to_json(plan), indent=1, sort_keys=True)


def read_plan_json(data: bytes, graph: PrimGraph) -> Plan:
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise AppError(f"the plan file is not JSON ({err})", hint="save a plan from the Plan page") from None
    return plan_from_json(obj, graph)


def conn_choices() -> list[str]:
    return [c.value for c in Conn]


@st.cache_data(show_spinner=False, max_entries=32)
def dot_to_svg(dot: str) -> bytes:
    """Render DOT with Graphviz's `dot` (Debian package graphviz)."""
    import graphviz

    try:
        return graphviz.Source(dot).pipe(format="svg")
    except graphviz.ExecutableNotFound:
        raise AppError("Graphviz's 'dot' program is not installed", hint="apt-get install graphviz") from None
    except graphviz.CalledProcessError as err:
        first = (err.stderr or b"").decode(errors="replace").strip().splitlines()[:1]
        raise AppError(f"Graphviz could not render the graph ({first[0] if first else err.returncode})") from None


# ---- engine capabilities that may not be exported yet -------------------------------------------

# Where each function lives while it is not yet re-exported from engine.api.
_MODULES = {
    "build_rprogram": "engine.rprogram.wavefront", "export_trace": "engine.rprogram.trace",
    "generate": "engine.codegen.generate", "run_model": "engine.runtime.execute",
    "make_inputs": "engine.runtime.inputs", "export_bundle": "engine.bundle",
    "make_plan": "engine.schedule.policies", "POLICIES": "engine.schedule.policies",
    "replay": "engine.schedule.edits", "validate": "engine.schedule.validate",
    "render_c": "engine.codegen.targets", "render_cuda": "engine.codegen.targets",
}


def engine_fn(name: str):
    """engine.api.<name>, else the module that defines it, else None (capability not built yet)."""
    fn = getattr(api, name, None)
    if fn is not None or name not in _MODULES:
        return fn
    import importlib

    try:
        return getattr(importlib.import_module(_MODULES[name]), name, None)
    except ImportError:
        return None


def available(name: str) -> bool:
    return engine_fn(name) is not None


# ---- inputs, runs, rProgram ----------------------------------------------------------------------


@st.cache_resource(show_spinner=False, max_entries=8)
def model_inputs(_graph: PrimGraph, model_hash: str, path: str) -> dict[str, np.ndarray]:
    """The sample's stored inputs (.io.npz) when it has them, else fixed-seed random inputs."""
    io = Path(path).with_suffix(".io.npz")
    names = [t.name for t in _graph.inputs]
    if io.exists():
        with np.load(io) as data:
            if all(n in data for n in names):
                return {n: data[n] for n in names}
    make_inputs = engine_fn("make_inputs")
    if make_inputs is None:
        raise AppError(f"random model inputs are {NOT_AVAILABLE}")
    return make_inputs(_graph, seed=0)


@st.cache_resource(show_spinner=False, max_entries=8)
def reference_outputs(_graph: PrimGraph, model_hash: str, path: str) -> dict[str, np.ndarray]:
    return api.run_reference(_graph, model_inputs(_graph, model_hash, path))


def max_rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|: near-zero entries are judged on the output's scale."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if want.size == 0:
        return 0.0
    if got.shape != want.shape:
        return float("inf")
    return float(np.abs(got - want).max()) / max(float(np.abs(want).max()), 1e-30)


@dataclass(frozen=True)
class RunResult:
    backend: str
    kernel_us: dict  # kernel name -> measured µs
    total_us: float
    max_rel_err: float
    ok: bool
    compile_seconds: float = 0.0
    run_seconds: float = 0.0


@st.cache_resource(show_spinner=False, max_entries=16)
def program_for(_graph: PrimGraph, _plan: Plan, model_hash: str, plan_hash: str, device: str):
    generate = engine_fn("generate")
    if generate is None:
        raise AppError(f"code generation is {NOT_AVAILABLE}")
    return generate(_plan, _graph, device)


@st.cache_resource(show_spinner=False, max_entries=16)
def run_plan(_graph: PrimGraph, _plan: Plan, model_hash: str, plan_hash: str, device: str, backend: str,
             path: str) -> RunResult:
    """Compile, run and profile the plan; outputs checked against the reference executor."""
    run_model = engine_fn("run_model")
    if run_model is None:
        raise AppError(f"compiling and running plans is {NOT_AVAILABLE}")
    inputs = model_inputs(_graph, model_hash, path)
    start = time.perf_counter()
    ran = run_model(_graph, inputs, plan=_plan, backend=backend, device=device)
    seconds = time.perf_counter() - start
    want = reference_outputs(_graph, model_hash, path)
    outputs = ran.outputs
    err = 0.0
    for tensor, onnx_name in zip(_graph.outputs, _graph.output_names):
        got = outputs[onnx_name] if onnx_name in outputs else outputs[tensor]
        ref = want[onnx_name] if onnx_name in want else want[tensor]
        err = max(err, max_rel_error(got, ref))
    kernel_us = {k.kernel: k.us for k in ran.profile.kernels} if ran.profile else {}
    result = RunResult(backend, kernel_us, float(sum(kernel_us.values())), err, err <= MATCH_TOLERANCE,
                       0.0, seconds)
    _RUNS[(model_hash, plan_hash, device, backend)] = result
    return result


@st.cache_resource(show_spinner=False, max_entries=16)
def rprogram_for(_plan: Plan, model_hash: str, plan_hash: str, device: str, _measured: dict | None = None,
                 measured_key: str = ""):
    build = engine_fn("build_rprogram")
    if build is None:
        raise AppError(f"rProgram scheduling is {NOT_AVAILABLE}")
    return build(_plan, get_device(device), profile=_measured or None)


def trace_json_text(rp) -> str:
    export = engine_fn("export_trace")
    if export is None:
        raise AppError(f"trace export is {NOT_AVAILABLE}")
    return json.dumps(export(rp))


_RUNS: dict[tuple, RunResult] = {}  # (model, plan, device, backend) -> result, for pages that only read


def cached_run(_graph, _plan, model_hash: str, plan_hash: str, device: str, backend: str, path: str):
    """The result of an earlier run of exactly this plan, without running anything."""
    return _RUNS.get((model_hash, plan_hash, device, backend))


@st.cache_resource(show_spinner=False, max_entries=16)
def kernel_sources(_graph: PrimGraph, _plan: Plan, model_hash: str, plan_hash: str, device: str) -> dict:
    """{"cuda": source, "c": source} of the whole program from the engine's printers; {} until they exist."""
    render_cuda, render_c = engine_fn("render_cuda"), engine_fn("render_c")
    if render_cuda is None or render_c is None or not available("generate"):
        return {}
    program = program_for(_graph, _plan, model_hash, plan_hash, device)
    return {"cuda": render_cuda(program), "c": render_c(program)}


@st.cache_resource(show_spinner=False, max_entries=8)
def bundle_bytes(_graph: PrimGraph, _plan: Plan, model_hash: str, plan_hash: str, device: str) -> bytes:
    import tempfile

    export = engine_fn("export_bundle")
    if export is None:
        raise AppError(f"the kernel bundle is {NOT_AVAILABLE}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(export(_graph, _plan, Path(tmp) / "bundle.zip", device=get_device(device)))
        return path.read_bytes()
