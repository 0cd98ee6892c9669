"""tileweave engine: ONNX -> PrimGraph -> Plan -> Program -> run/profile -> RProgram."""

__version__ = "0.1.0"
