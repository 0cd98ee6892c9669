"""Chrome trace-event export of rPrograms (opens in Perfetto / chrome://tracing): one process per
program, one thread per vEU plus a control track (launch, grid barriers); of a multi-device partition, one
process per device (its kernels) plus one for the links (a thread per device pair); `validate_trace`
checks the rules."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from engine.files import write_atomic
from engine.rprogram.model import RProgram, RProgramError

X_ARGS = ("kernel", "group", "stages", "block", "source")


def _ns(us: float) -> int:
    return round(us * 1000)


def _us(ns: int) -> float:
    # Times are kept on a whole-ns grid so rounding can never make neighbours on a track overlap.
    return ns / 1000


def export_trace(programs: RProgram | Sequence[RProgram]) -> dict:
    """{"traceEvents": [...], "displayTimeUnit": "ns"}; ts/dur in µs, time 0 = the program's launch."""
    progs = [programs] if isinstance(programs, RProgram) else list(programs)
    events: list[dict] = []
    for p, rp in enumerate(progs, start=1):
        events.extend(_program_events(rp, p))
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"tool": "tileweave rprogram", "programs": [rp.summary() for rp in progs]}}


def _program_events(rp: RProgram, pid: int) -> list[dict]:
    vd = rp.vdevice
    control = vd.veus  # the control track sorts after every vEU
    title = f"{rp.model_name} · {rp.policy} rProgram on {vd.device} ({vd.veus} vEUs)"
    out: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": title}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": control, "args": {"name": "launch / barriers"}},
        {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": control, "args": {"sort_index": -1}},
    ]
    for v in range(vd.veus):
        # Hardware hands blocks to SMs round-robin, so vEU v sits on SM v % SMs.
        name = f"vEU {v} (SM {v % vd.sm_count}, slot {v // vd.sm_count})"
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": v, "args": {"name": name}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": v, "args": {"sort_index": v}})
    launch = _ns(rp.launch_us)
    out.append(_x("launch", "control", pid, control, 0, launch, {"source": "modeled"}))
    for prev, step in zip(rp.steps, rp.steps[1:]):
        out.append(_x(f"grid barrier before step {step.index}", "control", pid, control,
                      launch + _ns(prev.end_us), launch + _ns(step.start_us), {"reason": step.reason}))
    step_of = {name: s for s in rp.steps for name in s.ops}
    for v, tasks in enumerate(rp.veus):
        for t in tasks:
            op = rp.operator(t.op)
            step = step_of[t.op]
            variant = op.variants[step.variants[step.ops.index(t.op)]]
            args = {"kernel": op.name, "group": op.group, "stages": list(op.stages), "block": t.block,
                    "source": variant.source, "step": step.index, "tile": list(variant.tile)}
            out.append(_x(op.name, "rtask," + variant.source.split()[0], pid, v,
                          launch + _ns(t.start_us), launch + _ns(t.end_us), args))
    return out


def _x(name: str, cat: str, pid: int, tid: int, start_ns: int, end_ns: int, args: dict) -> dict:
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": _us(start_ns),
            "dur": _us(max(0, end_ns - start_ns)), "args": args}


def export_partition_trace(partition) -> dict:
    """A Partition's modeled timeline of one request: process d+1 is device d (one track of its kernels,
    tensor-parallel slices marked), the last process holds one track per directed link (its transfers)."""
    events: list[dict] = []
    for d in range(partition.devices):
        pid = d + 1
        events += _named(pid, f"device {d} ({partition.device})", [(0, "kernels")])
        for k in (k for k in partition.kernels if k.device == d):
            events.append(_x(k.kernel, "kernel,modeled", pid, 0, _ns(k.start_us), _ns(k.end_us),
                             {"device": d, "tensor_parallel": k.tensor_parallel, "source": "modeled"}))
    pairs = sorted({(t.src, t.dst) for t in partition.transfers})
    pid = partition.devices + 1
    events += _named(pid, f"links ({partition.link.name})", [(k, f"device {a} → {b}") for k, (a, b) in enumerate(pairs)])
    for t in partition.transfers:
        events.append(_x(t.tensor, "transfer,modeled", pid, pairs.index((t.src, t.dst)), _ns(t.start_us),
                         _ns(t.end_us), {"bytes": t.bytes, "src": t.src, "dst": t.dst, "source": "modeled"}))
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"tool": "tileweave partition", "makespan_us": partition.makespan_us}}


def _named(pid: int, title: str, threads: list[tuple[int, str]]) -> list[dict]:
    out = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": title}},
           {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for tid, name in threads:
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return out


def write_trace(programs: RProgram | Sequence[RProgram], path: str | Path, *, trace: dict | None = None) -> Path:
    """Export, check, and write the trace JSON (`trace`: an already exported one, e.g. a partition's);
    RProgramError if it breaks a rule."""
    trace = trace if trace is not None else export_trace(programs)
    problems = validate_trace(trace)
    if problems:
        raise RProgramError(f"trace breaks {len(problems)} rule(s), first: {problems[0]}")
    path = Path(path)
    try:
        if not path.parent.is_dir():
            raise FileNotFoundError(2, "No such file or directory")
        write_atomic(path, json.dumps(trace).encode())
    except OSError as err:
        raise RProgramError(f"{path}: cannot write the trace ({err.strerror})", hint="check the folder") from None
    return path


def validate_trace(trace: dict) -> list[str]:
    """Every broken rule, one line each: the envelope, the fields of X and M events, named processes
    and threads with a fixed order, and no partial overlap of events on one track."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["trace is not an object with a 'traceEvents' list"]
    problems = []
    if trace.get("displayTimeUnit") not in ("ns", "ms"):
        problems.append(f"displayTimeUnit is {trace.get('displayTimeUnit')!r}, not 'ns' or 'ms'")
    named: dict[str, set] = {k: set() for k in ("process_name", "process_sort_index", "thread_name",
                                                  "thread_sort_index")}
    tracks: dict[tuple, list[tuple[int, int, str]]] = {}
    for k, e in enumerate(trace["traceEvents"]):
        ph = e.get("ph") if isinstance(e, dict) else None
        if ph == "M":
            if e.get("name") not in named or not isinstance(e.get("args"), dict):
                problems.append(f"event {k}: metadata event {e.get('name')!r} is not one of {sorted(named)}")
                continue
            key = e.get("pid") if e["name"].startswith("process") else (e.get("pid"), e.get("tid"))
            named[e["name"]].add(key)
        elif ph == "X":
            missing = [f for f in ("name", "cat", "pid", "tid", "ts", "dur", "args") if f not in e]
            if missing:
                problems.append(f"event {k}: X event lacks {', '.join(missing)}")
                continue
            if not isinstance(e["ts"], int | float) or not isinstance(e["dur"], int | float) or e["dur"] < 0:
                problems.append(f"event {k}: ts/dur must be numbers and dur >= 0, got {e['ts']!r}/{e['dur']!r}")
                continue
            if e["cat"].startswith("rtask"):
                lacking = [a for a in X_ARGS if a not in e["args"]]
                if lacking:
                    problems.append(f"event {k}: rTask event lacks args {', '.join(lacking)}")
            tracks.setdefault((e["pid"], e["tid"]), []).append((_ns(e["ts"]), _ns(e["ts"] + e["dur"]), e["name"]))
        else:
            problems.append(f"event {k}: phase {ph!r} is not 'X' or 'M'")
    for (pid, tid), evs in tracks.items():
        for kind, key in (("process_name", pid), ("process_sort_index", pid), ("thread_name", (pid, tid)),
                          ("thread_sort_index", (pid, tid))):
            if key not in named[kind]:
                problems.append(f"pid {pid} tid {tid}: no {kind} metadata event")
        evs.sort(key=lambda t: (t[0], -t[1]))
        open_: list[tuple[int, int, str]] = []  # enclosing events: nesting is allowed, crossing is not
        for ev in evs:
            while open_ and open_[-1][1] <= ev[0]:
                open_.pop()
            if open_ and ev[1] > open_[-1][1]:
                problems.append(f"pid {pid} tid {tid}: {ev[2]} [{ev[0]}, {ev[1]}) ns partially overlaps "
                                f"{open_[-1][2]} [{open_[-1][0]}, {open_[-1][1]}) ns")
            open_.append(ev)
    return problems
