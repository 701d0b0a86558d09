"""kiln/ir: LoopIR, kiln's own loop-level IR (see nodes.py for the op set)."""
from kiln.ir.indexing import FloorDiv, Mod, range_vars, simplify_index
from kiln.ir.nodes import (Body, Buffer, Extern, Graph, GraphInput, Layout, LoopNode, Op, Pointwise,
                           Reduction, TensorArg, Template, dtype_name, graph_device_type)
from kiln.ir.printer import format_graph
from kiln.ir.verify import IRVerificationError, verify

__all__ = ["Body", "Buffer", "Extern", "FloorDiv", "Graph", "GraphInput", "IRVerificationError", "Layout",
           "LoopNode", "Mod", "Op", "Pointwise", "Reduction", "TensorArg", "Template", "dtype_name", "format_graph",
           "graph_device_type", "range_vars", "simplify_index", "verify"]
