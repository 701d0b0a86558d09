"""Find the first ATen node whose value kiln computes wrongly.

A wrong answer is bisected down the backend ladder first (eager, aot_eager, kiln);
when only `kiln` is wrong, this narrows it to one node of the ATen graph: the graph
is cut after node k (its value becomes the only output), compiled by kiln and
compared with eager's value of the same node, binary-searching k. Values are
usually wrong from the first bad node on, so the search finds it in log2(n)
compiles; `linear=True` checks every node instead.

    from kiln.debug.bisect import capture_aten_graphs, first_wrong_node
    with capture_aten_graphs() as graphs:
        kiln.compile(model)(inputs)
    print(first_wrong_node(*graphs[0]))
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch


@dataclass
class BisectResult:
    node: str | None  # name of the first wrong node, None if every node matched
    code: str  # the node as the ATen graph prints it
    message: str  # what the accuracy rule said

    def __str__(self) -> str:
        if self.node is None:
            return "every node matches eager"
        return f"first wrong node: {self.node}\n  {self.code}\n  {self.message}"


@contextlib.contextmanager
def capture_aten_graphs():
    """Record (aten_gm, real inputs of its first call) of every graph kiln compiles inside the block.

    The example inputs the backend sees are fake tensors; the first call's real
    inputs are copied instead, so the graph can be re-run.
    """
    from kiln import backend

    graphs: list = []
    original, original_plain = backend._compile_aten_graph, backend._load_plain_inference

    def recording(gm, example_inputs, dump, mode, inference=False):
        compiled, cached_key = original(gm, example_inputs, dump, mode, inference)
        saved = copy.deepcopy(gm)

        def call(args):
            if not any(entry[0] is saved for entry in graphs):
                graphs.append((saved, [value.clone() if isinstance(value, torch.Tensor) else value
                                       for value in args]))
            return compiled(args)

        call._boxed_call = True
        return call, cached_key

    backend._compile_aten_graph = recording
    backend._load_plain_inference = lambda *args, **kwargs: None  # every graph traced to ATen, to be recorded
    try:
        yield graphs
    finally:
        backend._compile_aten_graph, backend._load_plain_inference = original, original_plain


def _tensor_nodes(gm: torch.fx.GraphModule) -> list:
    return [node for node in gm.graph.nodes if node.op == "call_function"
            and isinstance(node.meta.get("val"), torch.Tensor)]


def _cut_at(gm: torch.fx.GraphModule, target: torch.fx.Node) -> torch.fx.GraphModule:
    """A copy of gm that returns only `target`'s value."""
    graph = torch.fx.Graph()
    mapping: dict = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            break
        mapping[node] = graph.node_copy(node, lambda arg: mapping[arg])
        if node is target:
            break
    graph.output((mapping[target],))
    graph.eliminate_dead_code()
    return torch.fx.GraphModule(gm, graph)


def _random_like(value):
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return value
    return torch.randn_like(value)


def _check(gm, inputs, node) -> str | None:
    """None if kiln's value of `node` matches eager's, else the accuracy rule's message."""
    from kiln.backend import compile_aten_graph
    from kiln.config import config
    from kiln.testing import compare

    cut = _cut_at(gm, node)
    expected = cut(*inputs)
    with config.patch(strict=True, debug=False):
        compiled = compile_aten_graph(cut, list(inputs))
    got = compiled(list(inputs))
    verdict = compare(got, expected)
    return None if verdict.ok else verdict.message


def first_wrong_node(gm: torch.fx.GraphModule, example_inputs: list, *, linear: bool = False) -> BisectResult:
    """The first node of an ATen graph whose kiln value differs from eager's."""
    inputs = [value.clone() if isinstance(value, torch.Tensor) else value for value in example_inputs]
    nodes = _tensor_nodes(gm)
    if linear:
        for node in nodes:
            message = _check(gm, inputs, node)
            if message is not None:
                return BisectResult(node.name, node.format_node(), message)
        return BisectResult(None, "", "")
    low, high, found = 0, len(nodes) - 1, None
    while low <= high:
        middle = (low + high) // 2
        message = _check(gm, inputs, nodes[middle])
        if message is None:
            low = middle + 1
        else:
            found = (nodes[middle], message)
            high = middle - 1
    if found is None:
        return BisectResult(None, "", "")
    return BisectResult(found[0].name, found[0].format_node(), found[1])


__all__ = ["BisectResult", "capture_aten_graphs", "first_wrong_node"]
