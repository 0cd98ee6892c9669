"""`tileweave` command line: each subcommand lives with the code it drives and registers itself
here. Any TileweaveError becomes `error: <one line>` and exit code 2."""

from __future__ import annotations

import argparse
import sys

from engine.errors import TileweaveError

# (module, function) pairs; each function adds one subparser and sets `func` on it.
COMMANDS = [
    ("engine.commands", "add_info_command"),
    ("engine.commands", "add_device_command"),
    ("engine.commands", "add_cache_command"),
    ("engine.schedule.cli", "add_plan_command"),
    ("engine.codegen.cli", "add_compile_command"),
    ("engine.commands", "add_run_command"),
    ("engine.rprogram.cli", "add_rprogram_command"),
    ("engine.partition.cli", "add_partition_command"),
    ("engine.bundle.cli", "add_export_command"),
    ("engine.commands", "add_bench_command"),
    ("engine.schedule.tune_cli", "add_tune_command"),
    ("engine.commands", "add_app_command"),
]


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="tileweave",
        description="Fuse, tile and schedule ONNX models into GPU kernels; see, edit, compile, run.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module, fn in COMMANDS:
        getattr(importlib.import_module(module), fn)(sub)
    return parser




def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from engine.flags import dump

    dump("repro.sh", "#!/bin/sh\n# reproduce this run\ntileweave " + " ".join(_quote(a) for a in (argv or sys.argv[1:])) + "\n")
    try:
        return int(args.func(args) or 0)
    except TileweaveError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tileweave ... | head`: the reader left; stop quietly, as a SIGPIPE'd tool would
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 141
    finally:
        from engine.memo import report_at_debug

        report_at_debug()


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


if __name__ == "__main__":
    sys.exit(main())
