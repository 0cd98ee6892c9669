"""Tuning many models on a Ray cluster (`tileweave tune`): model paths × policies in, tuned plans and a
report out, measurements in the tuning database.

Every model's tune job is prepared here (planning is cheap); their measure tasks are farmed out: each
variant is compiled by a Ray task (CPU resources, retried when its worker dies) and timed by a measure
actor that owns one device — {"GPU": 1} for a GPU, the custom resource {"host_cpu": 1} for the host CPU —
so two measurements never share a device; an actor whose process dies is restarted and its call
retried. Results are recorded by this process as they arrive, once per task id. Without `--cluster`
(or RAY_ADDRESS) Ray starts embedded on this machine with `workers` CPUs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from engine.device import Device
from engine.errors import BackendError, TileweaveError
from engine.ir.graph import PrimGraph
from engine.raywire import pack, unpack
from engine.schedule.measure import REPEAT, Compiled, codegen_version, compile_variant, time_compiled
from engine.schedule.plan import Plan
from engine.schedule.tune import MeasureTask, TuneJob, task_rows
from engine.schedule.tunedb import TuneDB

HOST_RESOURCE = "host_cpu"  # one unit per machine whose CPU measures `--device host`
RETRIES = 3  # reruns of a compile task or a measure actor whose worker died
Progress = Callable[[int, int, int], None]  # (tasks done, tasks in all, kernels served from the database)
CompileFn = Callable[[PrimGraph, Plan, Device], Compiled]
TimeFn = Callable[..., Mapping[str, float]]


@dataclasses.dataclass
class TuneReport:
    """What a `tune_models` run did: one row per model and policy, the jobs (for their candidates and
    tuned plans), the tasks run, where they ran and how long it took."""

    rows: list[dict]
    jobs: list[TuneJob]
    plans: list[Plan]
    tasks: int
    hits: int
    where: str
    seconds: float
    db: str

    def to_json(self) -> dict:
        return {"rows": self.rows, "tasks": self.tasks, "db_hits": self.hits, "where": self.where,
                "seconds": round(self.seconds, 3), "db": self.db}


def tune_models(models: Sequence[str | Path], device: Device | str, *, policies: Sequence[str] = ("welder",),
                k: int = 2, workers: int | None = None, cluster: str | None = None, db: TuneDB | str | Path | None = None,
                local: bool = False, shapes: Mapping[str, tuple[int, ...]] | None = None, repeat: int = REPEAT,
                progress: Progress | None = None, compile_fn: CompileFn = compile_variant,
                time_fn: TimeFn = time_compiled) -> TuneReport:
    """Tune every model under every policy with `k` tile candidates per kernel, measuring on `device`:
    on Ray (embedded with `workers` CPUs, or `cluster`/RAY_ADDRESS), or in this process when `local`.
    `compile_fn`/`time_fn` replace the two halves of a measurement (tests inject faults with them)."""
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import plan_model
    from engine.schedule.policies import POLICIES
    from engine.schedule.tune import check_tune, finish_tune, prepare_tune, run_local

    check_tune(k)
    if not models:
        raise TileweaveError("tune needs at least one MODEL", hint="e.g. tileweave tune samples/masked_softmax.onnx")
    bad = [p for p in policies if p not in POLICIES or p == "user"]
    if bad:
        raise TileweaveError(f"--policy {bad[0]!r} is not a policy", hint="use unfused, elementwise, stitch or welder")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise TileweaveError(f"--workers {workers!r}: the number of CPUs for the embedded Ray must be 1 or more",
                             hint="e.g. --workers 2")
    address = None if local else cluster or os.environ.get("RAY_ADDRESS", "").strip() or None
    if address:  # before planning: a wrong address is the user's first mistake to hear about
        reach_address(address)
    device = get_device(device) if isinstance(device, str) else device
    started = time.perf_counter()
    own_db = not isinstance(db, TuneDB)
    db = db if isinstance(db, TuneDB) else TuneDB(db)
    try:
        jobs, graphs, pending, seen = [], {}, set(), set()
        job_id = os.urandom(8).hex()
        for path in models:
            if str(path) in seen:
                continue
            seen.add(str(path))
            graph0 = load_graph(path, dict(shapes or {}))
            for policy in dict.fromkeys(policies):
                graph, plan = plan_model(graph0, policy, device)
                jobs.append(prepare_tune(graph, plan, device, k, db=db, repeat=repeat, model=Path(path).stem,
                                         job_id=job_id, pending=pending))
                graphs[graph.structural_hash] = graph
        tasks = [t for job in jobs for t in job.tasks]
        hits = len({sig for job in jobs for sig in job.known})
        if progress:
            progress(0, len(tasks), hits)
        step = (lambda done, total: progress(done, total, hits)) if progress else None
        if local:
            from engine.schedule.measure import require_gpu_for

            if tasks:
                require_gpu_for(device)
            measures = {h: _local_measure(g, device, repeat, compile_fn, time_fn) for h, g in graphs.items()}
            run_local(tasks, measures, db, device, repeat=repeat, progress=step)
            where = f"in this process ({socket.gethostname()})"
        elif tasks:
            where = start_ray(cluster, workers)
            run_ray(tasks, graphs, db, device, repeat=repeat, progress=step, compile_fn=compile_fn, time_fn=time_fn)
        else:
            where = "nothing to measure: every kernel served from the tuning database"
        plans = [finish_tune(job, db) for job in jobs]
        rows = [_row(job, plan) for job, plan in zip(jobs, plans)]
        return TuneReport(rows, jobs, plans, len(tasks), hits, where, time.perf_counter() - started, str(db.path))
    finally:
        if own_db:
            db.close()


def _local_measure(graph: PrimGraph, device: Device, repeat: int, compile_fn: CompileFn, time_fn: TimeFn):
    def measure(plan: Plan):
        return time_fn(graph, compile_fn(graph, plan, device), device, repeat)
    return measure


def _row(job: TuneJob, plan: Plan) -> dict:
    base = next(keys for policy, j, _, keys in job.variants if policy == job.plan.policy and j == 0)
    untuned = [job.times.get(sig) for sig in base.values()]
    return {"model": job.model, "policy": job.plan.policy, "kernels": plan.kernels,
            "candidates": len(job.variants), "measured": len(job.tasks),
            "db_hits": len({sig for *_, keys in job.variants for sig in keys.values()} & job.known.keys()),
            "untuned_us": round(sum(untuned), 3) if all(u is not None for u in untuned) else None,
            "tuned_us": None if plan.measured_us is None else round(plan.measured_us, 3)}


# ---- Ray --------------------------------------------------------------------------------------


def check_address(address: str) -> tuple[str, int]:
    """(host, port) of a Ray address `HOST:PORT` or `ray://HOST:PORT`, or a one-line error."""
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TileweaveError(f"--cluster {address!r} is not a Ray address",
                             hint="give HOST:PORT of the head node (ray start --head prints it), e.g. 10.0.0.5:6379")
    return host, int(port)


def reach_address(address: str) -> None:
    """A one-line error unless something listens at the Ray address (ray.init waits minutes on an address
    nobody listens at)."""
    host, port = check_address(address)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as err:
        raise TileweaveError(f"--cluster {address}: nothing answers there ({err.strerror or err})",
                             hint="start the head with `ray start --head --port PORT`, or drop --cluster (and "
                                  "unset RAY_ADDRESS) to run on this machine") from None


def start_ray(cluster: str | None = None, workers: int | None = None) -> str:
    """Connect this process to Ray and say where the work runs: the cluster at `cluster` (or
    RAY_ADDRESS), else an embedded Ray with `workers` CPUs (default every core) and one host_cpu; an
    already started Ray (a test's) is used as it is."""
    import ray

    if ray.is_initialized():
        return _describe(ray, "Ray already running in this process")
    address = cluster or os.environ.get("RAY_ADDRESS", "").strip() or None
    if address:
        if workers is not None:
            raise TileweaveError("--workers sizes the embedded Ray; a cluster brings its own workers",
                                 hint="drop --workers, or drop --cluster (and unset RAY_ADDRESS)")
        reach_address(address)
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise TileweaveError(f"--cluster {address}: cannot join the Ray cluster there "
                                 f"({str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__})",
                                 hint="check the address and that the cluster runs Ray 2.60") from None
        return _describe(ray, f"Ray cluster at {address}")
    cpus = workers or os.cpu_count() or 1
    # Ray says on every embedded start that it turned token authentication on (it should, and it did):
    # not news to a tileweave user.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    ray.init(num_cpus=cpus, resources={HOST_RESOURCE: 1}, include_dashboard=False, log_to_driver=False,
             configure_logging=False, object_store_memory=256 << 20)
    return _describe(ray, "embedded Ray on this machine")


def _describe(ray, what: str) -> str:
    res = ray.cluster_resources()
    return (f"{what}: {len(ray.nodes())} node(s), {int(res.get('CPU', 0))} CPU(s), {int(res.get('GPU', 0))} GPU(s), "
            f"{int(res.get(HOST_RESOURCE, 0))} host_cpu")


def _compile_task(blob: bytes) -> bytes:
    """A compile task: (graph, plan, device, compile_fn) packed in, the Compiled packed out (raywire)."""
    graph, plan, device, compile_fn = unpack(blob)
    return pack(compile_fn(graph, plan, device))


class Measurer:
    """A Ray actor owning one device (one GPU, or the host CPU): times compiled variants one at a time."""

    def __init__(self, blob: bytes):
        device, version = unpack(blob)
        if codegen_version() != version:
            raise BackendError(f"worker {socket.gethostname()} runs tileweave code {codegen_version()}, the driver "
                               f"{version}", hint="install the same tileweave on every node of the cluster")
        self.device = device
        self.gpu = None
        self.inputs: dict[str, dict] = {}

    def measure(self, graph_blob: bytes, compiled_blob: bytes, args: bytes) -> bytes:
        """Time one compiled variant; everything in and out packed (raywire): ((times, worker))."""
        from engine.runtime.inputs import make_inputs

        graph, compiled = unpack(graph_blob), unpack(compiled_blob)
        repeat, time_fn = unpack(args)
        if self.device.kind != "cpu" and self.gpu is None:
            from engine.runtime.cuda_driver import attached_gpu

            self.gpu = attached_gpu()
        inputs = self.inputs.setdefault(graph.structural_hash, make_inputs(graph, seed=0))
        kwargs = {"inputs": inputs} if self.gpu is None else {"inputs": inputs, "gpu": self.gpu}
        times = dict(time_fn(graph, compiled, self.device, repeat, **kwargs))
        return pack((times, f"{socket.gethostname()}:{os.getpid()}"))

    def pid(self) -> int:
        return os.getpid()


def measure_slots(ray, device: Device) -> dict:
    """The Ray resources of one measure actor and how many such actors the cluster holds."""
    res = ray.cluster_resources()
    if device.kind != "cpu":
        n = int(res.get("GPU", 0))
        if not n:
            raise BackendError(f"--device {device.name}: the Ray cluster has no GPU to measure on",
                               hint="start GPU nodes (ray start --num-gpus N), or tune with --device host")
        return {"num_gpus": 1, "count": n}
    n = int(res.get(HOST_RESOURCE, 0))
    if not n:
        raise BackendError(f"--device host: no Ray node offers the {HOST_RESOURCE} resource to measure on",
                           hint=f"start the measuring node with ray start --resources '{{\"{HOST_RESOURCE}\": 1}}'")
    return {"resources": {HOST_RESOURCE: 1}, "count": n}


def run_ray(tasks: Sequence[MeasureTask], graphs: Mapping[str, PrimGraph], db: TuneDB, device: Device, *,
            repeat: int = REPEAT, progress: Callable[[int, int], None] | None = None,
            compile_fn: CompileFn = compile_variant, time_fn: TimeFn = time_compiled) -> list:
    """Compile and measure `tasks` on the connected Ray cluster, recording each result in `db` as it
    arrives (in this process, once per task id); the measure actors (for a test to kill)."""
    import ray

    slots = measure_slots(ray, device)
    count = slots.pop("count")
    refs = {h: ray.put(pack(g)) for h, g in graphs.items()}
    compile_remote = ray.remote(num_cpus=1, max_retries=RETRIES)(_compile_task)
    actor_class = ray.remote(Measurer).options(num_cpus=0, max_restarts=RETRIES, max_task_retries=RETRIES, **slots)
    actors = [actor_class.remote(pack((device, codegen_version()))) for _ in range(min(count, len(tasks)))]
    compiling = {compile_remote.remote(pack((graphs[t.graph_hash], t.plan, device, compile_fn))): t for t in tasks}
    timing = pack((repeat, time_fn))
    ready: deque = deque()
    free, measuring, done = list(actors), {}, 0
    while compiling or ready or measuring:
        while ready and free:
            task, compiled = ready.popleft()
            actor = free.pop()
            measuring[actor.measure.remote(refs[task.graph_hash], compiled, timing)] = (task, actor)
        finished, _ = ray.wait([*compiling, *measuring], num_returns=1)
        for ref in finished:
            if ref in compiling:
                ready.append((compiling.pop(ref), ref))
                continue
            task, actor = measuring.pop(ref)
            times, worker = _get(ray, ref, task)
            db.record(task_rows(task, times, device, repeat, worker))
            free.append(actor)
            done += 1
            if progress:
                progress(done, len(tasks))
    return actors


def _get(ray, ref, task: MeasureTask):
    """ray.get, with the engine's own errors as themselves and a dead worker as one line."""
    try:
        return unpack(ray.get(ref))
    except ray.exceptions.RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, TileweaveError):
            raise cause from None
        raise
    except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as err:
        raise BackendError(f"tune: a worker died more than {RETRIES} times timing {task.model}'s "
                           f"{task.policy} candidate {task.variant} ({type(err).__name__})",
                           hint="see the Ray logs of the node; rerun, finished results are in the database") from None
