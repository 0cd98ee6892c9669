"""The only module of the app that calls the engine (through engine.api). Model → PrimGraph;
(graph, policy, device, batching, edits) → (graph, Plan) through plan_model, so welder plans the
operator-batched graph; (graph, plan) → program, outputs/profile, rProgram, bundle, each cached on
(model hash, plan hash). The graph a plan was made on travels with it."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import streamlit as st

import engine.api as api
from engine.device import PRESETS, get_device, named_device
from engine.errors import TileweaveError
from engine.files import write_atomic
from engine.flags import cache_dir, time_limit_s
from engine.ir.graph import PrimGraph
from engine.memo import Memo
from engine.runtime.simt.report import Finding, KernelTraffic
from engine.schedule.plan import Conn, Edit, Plan, plan_to_json

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
UPLOAD_LIMIT_MB = 50
APP_TIME_LIMIT_S = 300.0  # per compile and per run, unless TILEWEAVE_TIME_LIMIT says otherwise
TUNE_TIME_LIMIT_S = 1800.0  # per tune job (the Tuning page's default: a job measures many kernels)
MATCH_TOLERANCE = 1e-3  # max rel err (max |got - ref| / max |ref|) for "matches reference"


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
    """The GPU presets, then host (this CPU, measured on first use: what the CPU backend runs on)."""
    return [*PRESETS, "host"]


@st.cache_resource(show_spinner=False)
def cuda_status() -> tuple[bool, str]:
    from engine.runtime.cuda_driver import cuda_available

    return cuda_available()


def policies() -> list[str]:
    return list(api.POLICIES)


def default_policy() -> str:
    return "welder"


# ---- plans -----------------------------------------------------------------------------------


def batching_applies(policy: str) -> bool:
    """Operator batching is a welder decision; the toggle does nothing for the other policies."""
    return policy == "welder"


def plan_with_edits(graph: PrimGraph, policy: str, device: str, edits: tuple[Edit, ...],
                    batching: bool = True) -> tuple[PrimGraph, Plan]:
    """(graph, plan): the policy's plan (welder: on the operator-batched graph when `batching`) with
    `edits` replayed and validated, or PlanError naming the rule broken."""
    return api.plan_model(graph, policy, get_device(device), batching=batching and batching_applies(policy),
                          edits=tuple(edits))


@dataclass(frozen=True)
class PlanResult:
    graph: PrimGraph  # the graph the plan was made on (operator-batched for welder): generate and run this
    plan: Plan
    refused: tuple[tuple[int, str], ...] = ()  # (edit index, reason) for edits that no longer apply
    seconds: float = 0.0


def edits_key(edits: tuple[Edit, ...]) -> str:
    return json.dumps([edit_to_json(e) for e in edits], sort_keys=True)


_PLANS: dict[tuple, PlanResult] = {}  # (model, policy, device, batching, edits key) -> plan, for extending


def _remember(key: tuple, result: PlanResult) -> PlanResult:
    if len(_PLANS) > 64:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[key] = result
    return result


def _extend_known(model_hash: str, policy: str, device: str, edits: tuple[Edit, ...],
                  batching: bool) -> tuple[PrimGraph, Plan] | None:
    """The plan of `edits` made by applying the last edits to an already built plan of a prefix of
    them (engine apply_edit: the same validated path replay takes), or None when no prefix is known.
    A large model's policy plan takes many seconds; one more edit on it takes milliseconds."""
    for cut in range(len(edits) - 1, -1, -1):
        known = _PLANS.get((model_hash, policy, device, batching, edits_key(edits[:cut])))
        if known is not None and not known.refused:
            graph, plan = known.graph, known.plan
            dev = get_device(device)
            for edit in edits[cut:]:
                plan = api.apply_edit(plan, graph, dev, edit)
            return graph, plan
    return None


def check_edits(graph: PrimGraph, model_hash: str, policy: str, device: str, edits: tuple[Edit, ...],
                batching: bool = True) -> Plan:
    """The plan with `edits`, or PlanError naming the rule the first refused one breaks; extends a
    known plan of a prefix of `edits` when there is one (see _extend_known)."""
    extended = _extend_known(model_hash, policy, device, tuple(edits), batching)
    if extended is not None:
        return extended[1]
    return plan_with_edits(graph, policy, device, tuple(edits), batching)[1]


def legal_connections(graph: PrimGraph, model_hash: str, policy: str, device: str, edits: tuple[Edit, ...],
                      batching: bool, producer: str, consumer: str) -> list[tuple[str, str]]:
    """(connection, "" when legal else the rule it breaks) for every level of one edge, each tried
    through the validated edit path on top of the current edits."""
    out = []
    for conn in Conn:
        edit = Edit.make("set_edge", producer=producer, consumer=consumer, conn=conn.value)
        try:
            check_edits(graph, model_hash, policy, device, tuple(edits) + (edit,), batching)
            out.append((conn.value, ""))
        except TileweaveError as err:
            out.append((conn.value, str(err)))
    return out


@st.cache_resource(show_spinner=False, max_entries=64)
def build_plan(_graph: PrimGraph, model_hash: str, policy: str, device: str, key: str,
               batching: bool = True) -> PlanResult:
    """Base policy plan with the edits of `key` replayed in order (extending a known plan of a prefix
    of them when there is one). When the whole list is refused (e.g. the base policy or the batching
    changed under it), edits are re-tried one by one: refused ones are reported and skipped so the
    others still apply."""
    start = time.perf_counter()
    edits = edits_from_json(json.loads(key))
    memo = (model_hash, policy, device, batching, key)
    try:
        extended = _extend_known(model_hash, policy, device, edits, batching) if edits else None
        if extended is not None:
            return _remember(memo, PlanResult(*extended, (), time.perf_counter() - start))
    except TileweaveError:
        pass
    try:
        graph, plan = plan_with_edits(_graph, policy, device, edits, batching)
        return _remember(memo, PlanResult(graph, plan, (), time.perf_counter() - start))
    except TileweaveError:
        pass
    kept: list[Edit] = []
    refused = []
    for k, edit in enumerate(edits):
        try:
            plan_with_edits(_graph, policy, device, tuple(kept + [edit]), batching)
            kept.append(edit)
        except TileweaveError as err:
            refused.append((k, str(err)))
    graph, plan = plan_with_edits(_graph, policy, device, tuple(kept), batching)
    return _remember(memo, PlanResult(graph, plan, tuple(refused), time.perf_counter() - start))


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


def save_edits(model_hash: str, policy: str, edits: tuple[Edit, ...], batching: bool = True) -> Path:
    """Autosave: the edit list, its base policy and the batching switch (edits name the stages of the
    graph that switch gives) for this model. Written atomically and fsynced: an app killed mid-write
    leaves the previous autosave whole, and a finished one survives a crash right after it."""
    text = json.dumps({"base_policy": policy, "batching": batching, "edits": [edit_to_json(e) for e in edits]},
                      indent=1)
    return write_atomic(edits_file(model_hash), text.encode(), durable=True)


def load_edits(model_hash: str) -> tuple[str, tuple[Edit, ...], bool] | None:
    """(base policy, edits, batching) autosaved for this model, or None."""
    path = edits_file(model_hash)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return (str(data.get("base_policy", "")), edits_from_json(data.get("edits", [])),
                bool(data.get("batching", True)))
    except (json.JSONDecodeError, AppError, AttributeError):
        return None  # a corrupt autosave must not lock the user out of the model


def plan_json_text(plan: Plan) -> str:
    return json.dumps(plan_to_json(plan), indent=1, sort_keys=True)


def read_plan_json(data: bytes, graph: PrimGraph) -> tuple[PrimGraph, Plan]:
    """(graph, plan) of a saved plan, or of a kernel bundle's plan.json (a .zip), for the model `graph`
    (re-batched when the plan was batched)."""
    if data[:2] == b"PK":
        from engine.bundle.read import bundle_plan_json

        return _checked(*api.load_plan(bundle_plan_json(data, "the uploaded bundle"), graph))
    try:
        obj = json.loads(data)
    except RecursionError:
        raise AppError("the plan file is not a tileweave plan (JSON nested too deeply)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise AppError(f"the plan file is not JSON ({err})", hint="save a plan from the Plan page") from None
    if not isinstance(obj, dict):
        raise AppError("the plan file is not a tileweave plan (not a JSON object)", hint="save a plan from the Plan page")
    return _checked(*api.load_plan(obj, graph))


def _checked(graph: PrimGraph, plan: Plan) -> tuple[PrimGraph, Plan]:
    """Refuse an uploaded plan that validate rejects (on its own device preset; a device that names no
    preset is never opened as a file)."""
    from engine.runtime.execute import check_plan

    check_plan(plan, graph, named_device(plan.device, "a100"))
    return graph, plan


def plan_batching(plan: Plan) -> bool:
    return bool(dict(plan.options).get("batching", False))


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


# ---- inputs, runs, rProgram ----------------------------------------------------------------------


@st.cache_resource(show_spinner=False, max_entries=8)
def model_inputs(_graph: PrimGraph, model_hash: str, path: str) -> dict[str, np.ndarray]:
    """The sample's stored inputs (.io.npz) when it has them, else fixed-seed random inputs; a model
    whose reference run would not fit the host's memory budget is refused before either is loaded."""
    from engine.runtime.budget import check_graph_memory, memory_budget

    check_graph_memory(_graph, memory_budget(), "reference")
    io = Path(path).with_suffix(".io.npz")
    names = [t.name for t in _graph.inputs]
    if io.exists():
        with np.load(io) as data:
            if all(n in data for n in names):
                return {n: data[n] for n in names}
    return api.make_inputs(_graph, seed=0)


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
    diff = np.abs(got - want)
    diff[np.isnan(got) & np.isnan(want)] = 0.0  # NaN where the reference has NaN too is a match
    if np.isnan(diff).any():
        return float("inf")  # a NaN (e.g. a never-written element) never matches; max() would skip it
    finite = np.abs(want[~np.isnan(want)])
    return float(diff.max()) / max(float(finite.max()) if finite.size else 0.0, 1e-30)


def outputs_error(graph: PrimGraph, outputs: dict, want: dict) -> float:
    """Largest max_rel_error over the graph's outputs (looked up by ONNX name, else tensor name)."""
    err = 0.0
    for tensor, onnx_name in zip(graph.outputs, graph.output_names):
        got = outputs[onnx_name] if onnx_name in outputs else outputs[tensor]
        ref = want[onnx_name] if onnx_name in want else want[tensor]
        err = max(err, max_rel_error(got, ref))
    return err


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
    return api.generate(_plan, _graph, device)


def default_time_limit() -> float:
    """Seconds each compile and each run may take in the app: TILEWEAVE_TIME_LIMIT, else APP_TIME_LIMIT_S."""
    return time_limit_s() or APP_TIME_LIMIT_S


def run_plan(_graph: PrimGraph, _plan: Plan, model_hash: str, plan_hash: str, device: str, backend: str,
             path: str, *, time_limit: float | None = None, poll=None) -> RunResult:
    """Compile, run and profile the plan (on `_graph`, the graph it was made on); outputs checked against
    the reference executor. The last result of this plan is reused, not run again. The compile and the
    run each get `time_limit` seconds and the run happens in a worker process, killed when `poll` raises
    (Streamlit's rerun when Cancel is clicked): TimeLimitError, or the cancel, leaves earlier results as
    they were. Not an st.cache function: `poll` writes to the page, which a cached call may not."""
    known = _RUNS.get((model_hash, plan_hash, device, backend))
    if known is not None:
        return known
    inputs = model_inputs(_graph, model_hash, path)
    start = time.perf_counter()
    ran = api.run_model(_graph, inputs, plan=_plan, backend=backend, device=device, time_limit=time_limit,
                        poll=poll)
    seconds = time.perf_counter() - start
    err = outputs_error(_graph, ran.outputs, reference_outputs(_graph, model_hash, path))
    kernel_us = {k.kernel: k.us for k in ran.profile.kernels} if ran.profile else {}
    result = RunResult(backend, kernel_us, float(sum(kernel_us.values())), err, err <= MATCH_TOLERANCE,
                       0.0, seconds)
    _RUNS[(model_hash, plan_hash, device, backend)] = result
    return result


@dataclass(frozen=True)
class SimVerifyResult:
    """A plan's printed CUDA run under the SIMT emulator (backend cuda-sim), outputs checked against the
    reference executor: the engine's own findings and per-kernel traffic (plain frozen dataclasses)."""

    ok: bool  # no findings, every launch ran and the outputs match
    outputs_match: bool
    max_rel_err: float
    launches: int  # launches run
    planned_launches: int  # launches in the program
    stopped: str  # the launch that could not finish and why ("" when all ran)
    findings: tuple[Finding, ...]
    kernels: tuple[KernelTraffic, ...]  # emulated bytes per kernel, `modeled` = the plan's traffic_bytes
    seconds: float


def sim_result(report, max_rel_err: float, planned_launches: int, seconds: float) -> SimVerifyResult:
    """An engine SimReport and the output check as the app's SimVerifyResult."""
    match = max_rel_err <= MATCH_TOLERANCE
    return SimVerifyResult(not report.findings and not report.stopped and match, match, max_rel_err,
                           report.launches, planned_launches, report.stopped, report.findings, report.kernels,
                           seconds)


def verify_simt(_graph: PrimGraph, _plan: Plan, model_hash: str, plan_hash: str, device: str,
                path: str, *, time_limit: float | None = None, poll=None) -> SimVerifyResult:
    """Run the plan's printed CUDA under the SIMT emulator (backend cuda-sim: g++ builds it, every launch
    runs with CUDA's semantics on the CPU) on the model's inputs; findings, bytes moved per kernel beside
    the modeled traffic, and the outputs checked against the reference executor. Engine errors (no C++
    compiler, a plan the emulator refuses) raise TileweaveError (one line). As run_plan: reused when this
    plan was verified before, bounded by `time_limit`, cancelled when `poll` raises."""
    known = _SIMS.get((model_hash, plan_hash, device))
    if known is not None:
        return known
    inputs = model_inputs(_graph, model_hash, path)
    start = time.perf_counter()
    ran = api.run_model(_graph, inputs, plan=_plan, backend="cuda-sim", device=device, time_limit=time_limit,
                        poll=poll)
    seconds = time.perf_counter() - start
    err = outputs_error(_graph, ran.outputs, reference_outputs(_graph, model_hash, path))
    result = sim_result(ran.sim, err, len(ran.program.launches) if ran.program else ran.sim.launches, seconds)
    _SIMS[(model_hash, plan_hash, device)] = result
    return result


_SIMS: dict[tuple, SimVerifyResult] = {}  # (model, plan, device) -> last cuda-sim verification


def cached_simt(model_hash: str, plan_hash: str, device: str) -> SimVerifyResult | None:
    """The last cuda-sim verification of exactly this plan, without running anything."""
    return _SIMS.get((model_hash, plan_hash, device))


@st.cache_resource(show_spinner=False, max_entries=16)
def rprogram_for(_plan: Plan, model_hash: str, plan_hash: str, device: str, _measured: dict | None = None,
                 measured_key: str = ""):
    return api.build_rprogram(_plan, get_device(device), profile=_measured or None)


def trace_json_text(rp) -> str:
    return json.dumps(api.export_trace(rp))


_RUNS: dict[tuple, RunResult] = {}  # (model, plan, device, backend) -> result, for pages that only read


def cached_run(_graph, _plan, model_hash: str, plan_hash: str, device: str, backend: str, path: str):
    """The result of an earlier run of exactly this plan, without running anything."""
    return _RUNS.get((model_hash, plan_hash, device, backend))


@st.cache_resource(show_spinner=False, max_entries=16)
def kernel_sources(_graph: PrimGraph, _plan: Plan, model_hash: str, plan_hash: str, device: str) -> dict:
    """{"cuda": source, "c": source} of the whole program from the engine's printers."""
    program = program_for(_graph, _plan, model_hash, plan_hash, device)
    return {"cuda": api.render_cuda(program), "c": api.render_c(program)}


@st.cache_resource(show_spinner=False, max_entries=8)
def bundle_bytes(_graph: PrimGraph, _plan: Plan, model_hash: str, plan_hash: str, device: str) -> bytes:
    """The kernel bundle zip of the plan (CUDA + PTX/CUBIN per arch, C, program/plan/trace JSON, weights);
    NVRTC bounded by the app's time limit (default_time_limit)."""
    return api.export_bundle(_graph, _plan, get_device(device), time_limit=default_time_limit())


# ---- overview layout -----------------------------------------------------------------------------


@st.cache_data(show_spinner=False, max_entries=64)
def layout_positions(plan_hash: str, fold: bool, dot: str) -> dict[str, tuple[float, float]]:
    """Graphviz `dot -Tplain` node positions of an overview's DOT; cached per (plan hash, folding)."""
    import subprocess

    from app.views.overview import parse_plain

    try:
        done = subprocess.run(["dot", "-Tplain"], input=dot.encode(), capture_output=True, timeout=60, check=False)
    except FileNotFoundError:
        raise AppError("Graphviz's 'dot' program is not installed", hint="apt-get install graphviz") from None
    except subprocess.TimeoutExpired:
        raise AppError("Graphviz took over 60 s to lay out the overview") from None
    if done.returncode != 0:
        first = done.stderr.decode(errors="replace").strip().splitlines()[:1]
        raise AppError(f"Graphviz could not lay out the overview ({first[0] if first else done.returncode})")
    return parse_plain(done.stdout.decode())


def measured_numbers(model_hash: str, plan_hash: str, device: str, backend: str) -> tuple[dict, dict, str]:
    """(kernel -> measured µs, kernel -> emulated bytes, where the times came from) of the last run and
    cuda-sim verification of exactly this plan; empty when it has not been run."""
    run = _RUNS.get((model_hash, plan_hash, device, backend))
    sim = _SIMS.get((model_hash, plan_hash, device))
    emulated = {k.kernel: k.global_load_bytes + k.global_store_bytes for k in sim.kernels} if sim else {}
    return (dict(run.kernel_us) if run else {}), emulated, (f"{backend} run" if run else "")


def timeline_measured(model_hash: str, plan_hash: str, device: str, backend: str) -> dict | None:
    """Kernel -> measured µs of the last run of this plan when those times describe the plan's device:
    a GPU run (backend cuda), or a CPU run of a plan made for `host` (this CPU). CPU-backend times of a
    plan for a GPU preset would put milliseconds on the GPU's vEUs: None then, the timeline stays modeled."""
    run = _RUNS.get((model_hash, plan_hash, device, backend))
    if run is None or not run.kernel_us or not (backend == "cuda" or device == "host"):
        return None
    return dict(run.kernel_us)


@st.cache_data(show_spinner=False, max_entries=8)
def annotated_onnx_bytes(path: str, model_hash: str, plan_hash: str, measured_key: str, _graph: PrimGraph,
                         _plan: Plan, _measured: dict | None = None) -> bytes:
    """The model file with each node's kernel, connections and modeled (measured) µs in its metadata."""
    return api.annotate_onnx(path, _graph, _plan, _measured)


# ---- tuning ----------------------------------------------------------------------------------

# The last tune job per (model hash, policy, K), for every session (the measurements themselves are in the
# shared tuning database): bounded and thread-safe, as Streamlit runs sessions on threads.
_TUNES = Memo("app.tunes", 16)


def tune_model(path: str, model_hash: str, policy: str, k: int, *, progress=None,
               time_limit: float | None = None) -> api.TuneReport:
    """Measured tuning of the model on this CPU (`tileweave tune --in-process`: the same tasks and the same
    tuning database, measured one after another in this process); `progress(done, total, db hits)`.
    With `time_limit`, TimeLimitError once a task finishes past that many seconds (the kernels measured so
    far stay in the tuning database: a new job is served from it). Not an st.cache function: `progress`
    writes to the page, and a click meanwhile (Cancel) raises Streamlit's rerun signal inside it, which
    stops the job after the task in flight. The last finished report is kept for the page."""
    from engine.errors import TimeLimitError

    start = time.perf_counter()

    def step(done: int, total: int, hits: int) -> None:
        if progress:
            progress(done, total, hits)
        elapsed = time.perf_counter() - start
        if time_limit is not None and elapsed > time_limit and done < total:
            raise TimeLimitError(f"the tune job was stopped after {elapsed:.1f} s, over its {time_limit:g} s "
                                 f"limit, with {done} of {total} tasks measured (kept in the tuning database)",
                                 hint="raise the time limit, or lower K")

    report = api.tune_models([path], "host", policies=(policy,), k=k, local=True, progress=step)
    return _TUNES.put((model_hash, policy, k), report)


def last_tune(model_hash: str, policy: str, k: int) -> api.TuneReport | None:
    return _TUNES.get((model_hash, policy, k))


def tune_db_summary() -> tuple[str, list[dict]]:
    """The tuning database's file and its rows per device and code version."""
    from engine.schedule.tunedb import TuneDB

    with TuneDB() as db:
        return str(db.path), db.summary()


# ---- partition -------------------------------------------------------------------------------


@st.cache_resource(show_spinner=False, max_entries=16)
def partition_for(_graph: PrimGraph, _plan: Plan, model_hash: str, plan_hash: str, device: str, devices: int,
                  link: str):
    """(graph, plan, Partition) of the current plan over `devices` copies of `device` (modeled; no Ray)."""
    return api.partition_model(_graph, _plan, device, devices, link)


def partition_trace_text(part) -> str:
    return json.dumps(api.export_partition_trace(part))
