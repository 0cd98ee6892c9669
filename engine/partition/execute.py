"""A Partition run for real on Ray: one actor per device compiles its kernels (C backend) and runs them;
tensors move between actors through Ray's object store along the transfer plan. Inputs and the
partitioned (graph, plan) in; outputs, bytes moved and per-device timings out. Ray is imported here only."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.codegen.kir import Program
from engine.device import Device
from engine.errors import PartitionError
from engine.ir.graph import PrimGraph
from engine.partition.model import Partition
from engine.raywire import pack, unpack
from engine.schedule.plan import Plan


@dataclass(frozen=True)
class PartitionRun:
    outputs: dict[str, np.ndarray]  # by ONNX output name
    transfer_bytes: int  # sum of nbytes every actor received from another actor
    received: tuple[tuple[str, int, int], ...]  # (tensor, device, bytes) as each actor received them
    device_seconds: tuple[float, ...]  # wall time each actor spent in its kernels
    address: str  # the Ray cluster the actors ran on


class StageWorker:
    """One device: its part of the program compiled once, then run piece by piece. Tensors it made or
    received stay in its own memory; only what the transfer plan names leaves it."""

    def __init__(self, blob: bytes):
        from engine.runtime.cpu import compile_program_c

        device, program, specs, weights, inputs = unpack(blob)
        self.device = device
        self.module = compile_program_c(program)
        self.specs = dict(specs)
        self.env = {k: np.ascontiguousarray(v, dtype=specs[k].dtype.np) for k, v in {**weights, **inputs}.items()}
        self.received: list[tuple[str, int, int]] = []
        self.seconds = 0.0

    def run(self, kernels: list[str], names_in: list[str], names_out: list[str], *blobs: bytes) -> tuple:
        """Take the tensors `names_in` (each packed by the actor that made it), run `kernels` in order, return
        the tensors `names_out` packed for other actors, and the count of kernels run last."""
        for name, blob in zip(names_in, blobs):
            arr = unpack(blob)
            self.env[name] = np.ascontiguousarray(arr, dtype=self.specs[name].dtype.np)
            self.received.append((name, self.device, int(arr.nbytes)))
        started = time.perf_counter()
        for launch in (ln for ln in self.module.program.launches if ln.kernel in set(kernels)):
            for t in launch.args:
                if t not in self.env:
                    self.env[t] = np.empty(self.specs[t].shape, self.specs[t].dtype.np)
            self.module.function(launch.kernel)(*[self.env[t].ctypes.data for t in launch.args])
        self.seconds += time.perf_counter() - started
        return (*[pack(self.env[n]) for n in names_out], len(kernels))

    def fetch(self, names: list[str]) -> list[bytes]:
        return [pack(self.env[n]) for n in names]

    def report(self) -> tuple[list[tuple[str, int, int]], float]:
        return self.received, self.seconds


def connect(cluster: str | None, devices: int):
    """The Ray module, initialised: `cluster` (or RAY_ADDRESS) when given, else an embedded Ray on this
    machine's cores (at least one logical CPU per device actor)."""
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a declared dependency
        raise PartitionError("Ray is not installed", hint="pip install ray==2.60.0") from None
    if ray.is_initialized():
        return ray
    address = cluster or os.environ.get("RAY_ADDRESS") or None
    if address:
        check_reachable(address)
    try:
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(num_cpus=max(devices, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as err:
        first = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise PartitionError(f"cannot reach the Ray cluster at {address!r} ({first})",
                             hint="start one with `ray start --head` and pass its address, or drop --cluster") from None
    return ray


def check_reachable(address: str, timeout: float = 3.0) -> None:
    """One line, fast, when HOST:PORT (or ray://HOST:PORT) does not answer (ray.init would retry for
    minutes); "auto" and other forms are left to Ray."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        raise PartitionError(f"cannot reach the Ray cluster at {address!r} ({err.strerror or err})",
                             hint="start one with `ray start --head` and pass its address, or drop --cluster") from None


def device_programs(program: Program, partition: Partition) -> list[Program]:
    """Each device's share of `program`: its kernels and launches in launch order."""
    out = []
    for stage in partition.stages:
        mine = set(stage.kernels)
        out.append(dataclasses.replace(
            program, name=f"{program.name}_dev{stage.device}",
            kernels=tuple(k for k in program.kernels if k.name in mine),
            launches=tuple(ln for ln in program.launches if ln.kernel in mine)))
    return out


def _nvrtc_in_process() -> bool:
    """Whether libnvrtc is mapped into this process (Linux: /proc/self/maps; elsewhere False)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return "libnvrtc" in maps.read()
    except OSError:
        return False


def _child_main() -> None:
    """In a fresh process: `run_partition` on the packed arguments from stdin; the packed result (or the
    exception) to stdout."""
    import sys

    graph, plan, partition, inputs, device, cluster = unpack(sys.stdin.buffer.read())
    try:
        out = run_partition(graph, plan, partition, inputs, device=device, cluster=cluster)
    except Exception as err:  # noqa: BLE001 - handed to the parent, which raises it
        out = err
    sys.stdout.buffer.write(pack(out))


def _run_in_fresh_process(blob: bytes) -> PartitionRun:
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "TILEWEAVE_PARTITION_CHILD": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run([sys.executable, "-c", "from engine.partition.execute import _child_main; _child_main()"],
                          input=blob, capture_output=True, env=env)
    if proc.returncode != 0 or not proc.stdout:
        last = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise PartitionError(f"the partition's driver process failed ({last})", hint="run it again")
    out = unpack(proc.stdout)
    if isinstance(out, Exception):
        raise out
    return out


def run_partition(graph: PrimGraph, plan: Plan, partition: Partition, inputs: Mapping[str, np.ndarray], *,
                  device: Device | str, cluster: str | None = None) -> PartitionRun:
    """Run `partition` of (graph, plan) on `partition.devices` Ray actors; outputs by ONNX name.

    A process that has loaded NVRTC (the app after a CUDA compile, a test session) drives Ray from a
    fresh Python process instead, joined to the same cluster: with libnvrtc in the driver, Ray 2.60
    handed actors corrupt arguments (tensor specs under wrong names; then 'Unpack failed: incomplete
    input' on bert_layer's two-device welder plan), and nothing but a clean driver avoided it."""
    if _nvrtc_in_process() and not os.environ.get("TILEWEAVE_PARTITION_CHILD"):
        import ray

        address = cluster or (ray.get_runtime_context().gcs_address if ray.is_initialized() else None)
        return _run_in_fresh_process(pack((graph, plan, partition, dict(inputs), device, address)))
    from engine.codegen.generate import generate
    from engine.partition.plan import INPUT_DEVICE

    program = generate(plan, graph, device, target="c")
    if [ln.kernel for ln in program.launches] != [k.kernel for k in partition.kernels]:
        raise PartitionError("the partition was made for another plan of this model", hint="partition it again")
    ray = connect(cluster, partition.devices)
    where = {k.kernel: k.device for k in partition.kernels}
    progs = device_programs(program, partition)
    threads = str(max(1, (os.cpu_count() or 1) // partition.devices))
    env = {"OMP_NUM_THREADS": threads, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    actor = ray.remote(StageWorker).options(num_cpus=1, runtime_env={"env_vars": env})
    given = {t.name: inputs[t.name] for t in graph.inputs}
    workers = []
    for d, prog in enumerate(progs):
        consts = {t for ln in prog.launches for t in ln.args if t in graph.weights}
        specs = {t: graph.specs[t] for ln in prog.launches for t in ln.args} | {t.name: t for t in graph.inputs}
        workers.append(actor.remote(pack((d, prog, specs, {t: graph.weights[t] for t in consts},
                                          given if d == INPUT_DEVICE else {}))))

    # Pieces: runs of consecutive launches on one device, each one actor call.
    pieces: list[tuple[int, list[str]]] = []
    for ln in program.launches:
        d = where[ln.kernel]
        if pieces and pieces[-1][0] == d:
            pieces[-1][1].append(ln.kernel)
        else:
            pieces.append((d, [ln.kernel]))
    made_in = {t: p for p, (_, kernels) in enumerate(pieces) for k in kernels for t in program.kernel(k).stages}
    sends: dict[int, list[str]] = {}  # piece -> tensors it returns; -1: the inputs device 0 holds
    for t in partition.transfers:
        piece = made_in.get(t.tensor, -1)
        if t.tensor not in sends.setdefault(piece, []):
            sends[piece].append(t.tensor)
    refs: dict[str, object] = {}

    def call(worker, kernels: list[str], d: int, out: list[str]):
        need = [t.tensor for t in partition.transfers if t.dst == d and (t.tensor, d) not in delivered
                and any(t.tensor in ln.args for ln in program.launches if ln.kernel in kernels)]
        delivered.update((t, d) for t in need)
        result = worker.run.options(num_returns=len(out) + 1).remote(kernels, need, out, *[refs[t] for t in need])
        result = list(result) if out else [result]  # one return comes back as a bare ObjectRef
        refs.update(zip(out, result[:-1]))
        return result[-1]

    delivered: set[tuple[str, int]] = set()
    done = []
    if sends.get(-1):
        done.append(call(workers[INPUT_DEVICE], [], INPUT_DEVICE, sends[-1]))
    for p, (d, kernels) in enumerate(pieces):
        done.append(call(workers[d], kernels, d, sends.get(p, [])))
    try:
        ray.get(done)
        outputs = {}
        for name, t in zip(graph.output_names, graph.outputs):
            d = where[next(k for k in program.launches if t in program.kernel(k.kernel).stages).kernel]
            outputs[name] = np.array(unpack(ray.get(workers[d].fetch.remote([t]))[0]))
        reports = ray.get([w.report.remote() for w in workers])
    finally:
        for w in workers:
            ray.kill(w)
    received = tuple(r for rec, _ in reports for r in rec)
    return PartitionRun(outputs, sum(r[2] for r in received), received, tuple(s for _, s in reports),
                        str(ray.get_runtime_context().gcs_address))
