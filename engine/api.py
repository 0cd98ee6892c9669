"""The Python API: the one set of functions the CLI, the app and the tests call.

model file -> PrimGraph -> Plan -> Program -> outputs/Profile -> RProgram -> bundle.
Each function is pure in its inputs (the app caches on model hash + plan hash).
"""

from __future__ import annotations

from engine.bundle.annotate import annotate_onnx
from engine.bundle.export import export_bundle
from engine.codegen.api import compile_program
from engine.codegen.generate import generate
from engine.codegen.targets import render_c, render_cuda
from engine.frontend.importer import Graph, import_onnx, load_graph, lower, supported_ops
from engine.ir.graph import PrimGraph
from engine.partition.links import LINKS, get_link
from engine.partition.plan import partition_model
from engine.profile.bench import bench_models
from engine.rprogram.trace import export_partition_trace, export_trace
from engine.rprogram.wavefront import build_rprogram
from engine.runtime.execute import RunResult, run_model
from engine.runtime.inputs import make_inputs
from engine.runtime.reference import run_reference
from engine.schedule.edits import apply_edit, apply_to_identical_layers, replay
from engine.schedule.farm import TuneReport, tune_models
from engine.schedule.pipeline import batching_decisions, graph_for_plan, load_plan, plan_model
from engine.schedule.policies import POLICIES, make_plan
from engine.schedule.validate import validate

__all__ = [
    "Graph", "PrimGraph", "import_onnx", "load_graph", "lower", "supported_ops", "run_reference",
    "build_rprogram", "export_trace", "export_partition_trace", "partition_model", "get_link", "LINKS",
    "run_partition",
    "generate", "render_cuda", "render_c", "run_model", "RunResult", "compile_program", "make_inputs",
    "export_bundle", "annotate_onnx", "bench_models",
    "POLICIES", "make_plan", "validate", "replay", "apply_edit", "apply_to_identical_layers",
    "plan_model", "load_plan", "graph_for_plan", "batching_decisions", "tune_models", "TuneReport",
]


def run_partition(*args, **kwargs):
    """engine.partition.execute.run_partition, imported on call (it is the only path that imports Ray)."""
    from engine.partition.execute import run_partition as run

    return run(*args, **kwargs)
