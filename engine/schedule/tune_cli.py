"""`tileweave tune MODEL... --device D`: measured tuning of many models farmed out to Ray (embedded, or
`--cluster ADDRESS`), with a progress bar on stderr and a summary table (or --json); results go to the
tuning database (--db), which --import-db/--export-db merge with and write as JSON lines."""

from __future__ import annotations

import argparse
import json
import sys

from engine.errors import TileweaveError


def add_tune_command(sub) -> None:
    from engine.commands import add_models_args
    from engine.schedule.tune import MAX_TUNE

    p = sub.add_parser(
        "tune", help="measure tile candidates of many models on Ray workers; results in the tuning database",
        description="Plan each MODEL with each --policy for --device, then measure the top K tile candidates of "
                    "every kernel (for welder also the other policies' kernels, region by region) and keep the "
                    "fastest. Each candidate is a compile task (a Ray task on a CPU) and a measure task (a Ray "
                    "actor that owns the device: one GPU, or the host CPU through the host_cpu resource; two "
                    "measurements never share one). A worker that dies has its task rerun; each result is "
                    "recorded once. Ray starts embedded on this machine unless --cluster or RAY_ADDRESS names a "
                    "cluster. Measurements are kept in the tuning database, keyed by subgraph signature, device "
                    "and code version: a second run of the same job measures nothing. See docs/scale-out.md.")
    add_models_args(p, nargs="*")
    p.add_argument("--device", default="host",
                   help="device measured on: host (this CPU, the default) or a GPU preset (v100, a100, rtx3090, "
                        "h100, h200) or device file, measured on the cluster's GPUs")
    p.add_argument("--policy", action="append", dest="policies", metavar="P",
                   help="policy to tune: unfused | elementwise | stitch | welder (repeatable; default welder)")
    p.add_argument("--tune", type=int, default=2, metavar="K",
                   help=f"tile candidates measured per kernel, 1..{MAX_TUNE} (default 2)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="CPUs of the embedded Ray (default: every core); not with --cluster")
    p.add_argument("--cluster", default=None, metavar="ADDRESS",
                   help="HOST:PORT of a running Ray cluster's head (default: RAY_ADDRESS, else embedded Ray)")
    p.add_argument("--in-process", dest="in_process", action="store_true",
                   help="measure one task after another in this process, without Ray (the one-worker baseline)")
    p.add_argument("--db", default=None, metavar="FILE",
                   help="the tuning database, SQLite (default: TILEWEAVE_TUNE_DB, else ~/.cache/tileweave/tune/"
                        "tune.sqlite)")
    p.add_argument("--import-db", dest="import_db", metavar="FILE.jsonl",
                   help="first merge these measurements (a --export-db file, e.g. from a cluster) into the database")
    p.add_argument("--export-db", dest="export_db", metavar="FILE.jsonl",
                   help="last write every measurement of the database here as JSON lines")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    from engine.commands import parse_shapes
    from engine.files import check_output
    from engine.schedule.farm import check_address, tune_models
    from engine.schedule.tune import check_tune
    from engine.schedule.tunedb import TuneDB

    if not args.models and not (args.import_db or args.export_db):
        raise TileweaveError("tune needs a MODEL (or --import-db / --export-db alone)",
                             hint="e.g. tileweave tune samples/masked_softmax.onnx --device host")
    check_tune(args.tune)
    if args.cluster is not None:
        check_address(args.cluster)
    if args.in_process and (args.cluster or args.workers is not None):
        raise TileweaveError("--in-process runs without Ray; --cluster and --workers are for Ray",
                             hint="drop one of them")
    shapes = parse_shapes(args.shape)
    if args.export_db:
        check_output(args.export_db, "--export-db", inputs=(*(args.models or ()), args.import_db, args.db), kind="json")
    with TuneDB(args.db) as db:
        if args.import_db:
            read, new = db.import_jsonl(args.import_db)
            print(f"imported {args.import_db}: {read} measurement(s), {new} new", file=sys.stderr)
        report = None
        if args.models:
            bar = ProgressBar(sys.stderr)
            try:
                report = tune_models(args.models, args.device, policies=args.policies or ("welder",), k=args.tune,
                                     workers=args.workers, cluster=args.cluster, db=db, local=args.in_process,
                                     shapes=shapes, progress=bar.update)
            finally:
                bar.close()
                _stop_embedded_ray()
        if args.export_db:
            n = db.export_jsonl(args.export_db)
            print(f"exported {n} measurement(s) to {args.export_db}", file=sys.stderr)
    if report is not None:
        print(json.dumps(report.to_json(), indent=1) if args.json else format_report(report))
    return 0


def _stop_embedded_ray() -> None:
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


class ProgressBar:
    """tasks done/total and database hits on one stderr line (redrawn on a terminal, a line per step
    otherwise)."""

    def __init__(self, stream, width: int = 30):
        self.stream, self.width, self.drawn = stream, width, False

    def update(self, done: int, total: int, hits: int) -> None:
        filled = self.width if total == 0 else self.width * done // total
        line = f"tune [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} tasks, {hits} db hits"
        tty = getattr(self.stream, "isatty", lambda: False)()
        self.stream.write(("\r" + line) if tty else line + "\n")
        self.stream.flush()
        self.drawn = tty

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def format_report(report) -> str:
    head = ("model", "policy", "kernels", "candidates", "measured", "db hits", "untuned us", "tuned us")
    rows = [head] + [(r["model"], r["policy"], str(r["kernels"]), str(r["candidates"]), str(r["measured"]),
                      str(r["db_hits"]), _us(r["untuned_us"]), _us(r["tuned_us"])) for r in report.rows]
    widths = [max(len(row[k]) for row in rows) for k in range(len(head))]
    lines = ["  ".join(c.ljust(w) if k < 2 else c.rjust(w) for k, (c, w) in enumerate(zip(row, widths))) for row in rows]
    lines.append(f"{report.tasks} task(s) measured, {report.hits} kernel(s) served from the database, "
                 f"{report.seconds:.1f} s; {report.where}; database {report.db}")
    return "\n".join(lines)


def _us(v) -> str:
    return "-" if v is None else f"{v:.1f}"
