"""A graph traced inside DDP's forward, split where DDP's gradient buckets end.

DDP all-reduces a bucket of gradients as soon as every gradient in it is ready. A graph compiled
whole has one backward, which produces every gradient at its end: no bucket can be sent before the
backward is over, and communication never overlaps computation. Split where DDP's buckets end,
each piece has its own backward: the pieces' backwards run last piece first, and each bucket's
all-reduce starts while the earlier pieces' backwards still run. (TorchDynamo's DDPOptimizer does
the same for torch.compile.)

DDP fills its buckets with the parameters in reverse order of use: the first bucket, capped at
`first_bucket_bytes_cap` (1 MiB by default), holds the last parameters the forward uses. `plan`
walks the graph backwards, counts each parameter at its last use in the forward (where the backward
makes its gradient), and ends a piece when the parameters counted so far fill the bucket's cap. A cut that a non-tensor value would cross
(a tuple, a number, an autocast region's state), or inside a no_grad region, is dropped: its two
pieces stay one.

Each piece is an FX graph of its own, compiled by the graph compiler with example inputs: the
frame's own tensors for graph inputs, and for values another piece computes, tensors of the
metadata the trace recorded (the trace's fake values: nothing is computed twice). The callable
returned runs the compiled pieces in order.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx

from kiln import _torch

log = logging.getLogger("kiln")


@dataclass
class Piece:
    """Nodes [start, stop) of the graph's compute nodes; `inputs`: what they read from outside (graph inputs
    or earlier pieces' nodes), `outputs`: their values read after them (later pieces, the graph's output)."""

    start: int
    stop: int
    inputs: list
    outputs: list
    parameter_bytes: int = 0


def _parameter_inputs(graph_module: torch.fx.GraphModule, example_inputs: list) -> dict:
    """Placeholder -> bytes, for the graph inputs that are parameters DDP reduces (they require grad)."""
    placeholders = [node for node in graph_module.graph.nodes if node.op == "placeholder"]
    return {node: value.numel() * value.element_size()
            for node, value in zip(placeholders, example_inputs)
            if isinstance(value, torch.nn.Parameter) and value.requires_grad}


def _is_tensor_value(node: torch.fx.Node) -> bool:
    return node.op == "placeholder" or isinstance(node.meta.get("example_value"), torch.Tensor)


def plan(graph_module: torch.fx.GraphModule, example_inputs: list, first_cap: int, cap: int) -> list[Piece]:
    """The pieces, in forward order, and the parameter bytes each one's backward makes ready."""
    nodes = [node for node in graph_module.graph.nodes if node.op not in ("placeholder", "output")]
    index = {node: position for position, node in enumerate(nodes)}
    bytes_at: dict[int, int] = {}  # DDP counts a parameter where the backward first reaches it: its last use
    for parameter, size in _parameter_inputs(graph_module, example_inputs).items():
        readers = [index[user] for user in parameter.users if user in index]
        if readers:
            bytes_at[max(readers)] = bytes_at.get(max(readers), 0) + size
    cuts, filled, limit = [], 0, first_cap
    for position in range(len(nodes) - 1, -1, -1):
        if filled >= limit:  # the bucket is full: this node, and those before it, go to the next piece
            cuts.append(position + 1)
            filled, limit = 0, cap
        filled += bytes_at.get(position, 0)
    grad_at = _grad_mode_at(nodes)
    bounds = [0] + sorted(cut for cut in cuts if grad_at[cut]) + [len(nodes)]
    pieces = [_piece(nodes, index, start, stop, bytes_at) for start, stop in zip(bounds, bounds[1:])]
    merged = pieces[:1]
    for piece in pieces[1:]:
        if all(_is_tensor_value(node) for node in piece.inputs):
            merged.append(piece)
        else:  # a tuple or a number would cross the cut: the two pieces stay one
            merged[-1] = _piece(nodes, index, merged[-1].start, piece.stop, bytes_at)
    return merged


def _grad_mode_at(nodes: list) -> list[bool]:
    """Per position, whether grad mode is on there as at the graph's start (a split traces with it on): a cut inside
    a `torch.no_grad()` region would leave the region's end to another piece. (An autocast region's enter and exit
    are joined by the value they pass, so no cut separates them.)"""
    enabled, at = True, []
    for node in nodes:
        at.append(enabled)
        if node.op == "call_function" and node.target is torch._C._set_grad_enabled:
            enabled = bool(node.args[0])
    return at + [enabled]


def _piece(nodes: list, index: dict, start: int, stop: int, bytes_at: dict) -> Piece:
    inputs, outputs = [], []
    for node in nodes[start:stop]:
        for read in node.all_input_nodes:
            if (read not in index or index[read] < start) and read not in inputs:
                inputs.append(read)
        if any(user not in index or index[user] >= stop for user in node.users):
            outputs.append(node)
    return Piece(start, stop, inputs, outputs, sum(bytes_at.get(position, 0) for position in range(start, stop)))


def compile_split(graph_compiler: Callable, graph_module: torch.fx.GraphModule, example_inputs: list,
                  caps: tuple[int, int]) -> Callable | None:
    """The graph compiled as one piece per DDP bucket, run in order by the callable returned; None where it
    stays one piece."""
    pieces = plan(graph_module, example_inputs, *caps)
    if len(pieces) < 2:
        return None
    nodes = [node for node in graph_module.graph.nodes if node.op not in ("placeholder", "output")]
    placeholders = [node for node in graph_module.graph.nodes if node.op == "placeholder"]
    examples = dict(zip(placeholders, example_inputs))
    slot = {node: position for position, node in enumerate(placeholders)}  # where the runner keeps each value
    steps = []
    for number, piece in enumerate(pieces):
        graph = torch.fx.Graph()
        copies = {}
        for read in piece.inputs:
            copies[read] = graph.placeholder(read.name)
            copies[read].meta = dict(read.meta)
        for node in nodes[piece.start:piece.stop]:
            copies[node] = graph.node_copy(node, copies.__getitem__)
        graph.output(tuple(copies[node] for node in piece.outputs))
        module = torch.fx.GraphModule(graph_module, graph, class_name=f"DDPPiece{number}")
        compiled = graph_compiler(module, [examples[read] if read in examples else _example(read)
                                           for read in piece.inputs])
        steps.append((compiled, tuple(slot[read] for read in piece.inputs)))
        for node in piece.outputs:
            slot[node] = len(slot)
    (results,) = [node.args[0] for node in graph_module.graph.nodes if node.op == "output"]
    result_slots = tuple(slot[node] for node in results)
    log.info("DDP: the graph runs as %d pieces, one per gradient bucket (caps %d and %d bytes), of %s parameter "
             "bytes", len(pieces), *caps, [piece.parameter_bytes for piece in pieces])

    def run(*args):
        values = list(args)
        for compiled_piece, reads in steps:
            values.extend(compiled_piece(*[values[position] for position in reads]))
        return tuple(values[position] for position in result_slots)

    run.pieces = len(pieces)
    return run


def _example(node: torch.fx.Node) -> torch.Tensor:
    """A tensor of the traced value's metadata (zeros): what another piece computes at run time."""
    fake = node.meta["example_value"]
    with _torch.real_tensors():
        tensor = torch.empty_strided(tuple(fake.shape), tuple(fake.stride()), dtype=fake.dtype, device=fake.device)
        tensor.zero_()
    return tensor.requires_grad_(fake.requires_grad)
