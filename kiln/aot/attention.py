"""Attention calls in the torch-level graph, made acceptable to the fused SDPA kernels before tracing.

`F.scaled_dot_product_attention` picks its kernel when AOTAutograd traces it: a fused one (flash,
memory-efficient, cuDNN) when its inputs pass torch's checks, else the math decomposition. The
math path materializes the scores and probabilities (float32 for bf16 inputs on CUDA) and, in
training, saves them and a dropout mask of the scores' shape for the backward: 12 x 126 MB for
BERT-base at 8 x 512, where the fused kernels save their output and log-sum-exp.

Every fused kernel refuses an input whose last dimension has a stride other than 1. Hugging Face
models hand SDPA exactly such a mask under a compiler: eager skips an all-ones padding mask after
reading its values, a trace cannot read them, so it materializes the mask as a broadcast view
(BERT's is bool (8, 1, 512, 512) with strides (0, 512, 1, 0), measured on the H200). Copying such
an input to a contiguous one costs one small kernel (2 MB for BERT's mask) and lets the trace pick
the memory-efficient kernel.

Inference calls too: torch's math path upcasts 16-bit queries, keys and values to float32, so its
two products run in float32 and its scores and probabilities are float32 (BERT-base at 8 x 512:
96 x 512 x 512 of each per layer), where kiln could only fuse the softmax between the products.
`config.dense_attention_inputs` chooses: 'all' (the default), 'training', or 'off'.

A mask that depends on no input is a constant of the graph's shapes. Hugging Face models build the
causal mask from two aranges when the library cannot tell it may skip the mask (transformers 5.17
under a compiler: `le(arange(S)[None, None, None, :], arange(L)[None, None, :, None])`, expanded
over the batch). With a mask, torch can at best pick the memory-efficient kernel with a bias, which
reads the mask and computes every block; `is_causal=True` lets it pick flash attention, which skips
the blocks above the diagonal. `causal_masks(gm)` evaluates each such mask once at compile time and,
where it is exactly torch's `is_causal` pattern (the lower triangle of an L x S matrix of ones) or
masks nothing, drops it (`config.causal_attention_masks`).
"""
from __future__ import annotations

import contextlib
import operator

import torch

from kiln import _torch
from kiln.config import config

_SDPA = {torch.nn.functional.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
_TENSOR_ARGUMENTS = ("query", "key", "value", "attn_mask")


def make_attention_fusable(gm: torch.fx.GraphModule, devices: frozenset = frozenset({"cuda"}),
                           calls: str | None = None) -> int:
    """Give every SDPA call on `devices` that `calls` selects ('training', 'all' or 'off'; by default
    `config.dense_attention_inputs`) inputs whose last dimension has stride 1 (a `.contiguous()` copy
    where it has not). Returns how many inputs it copied. Needs the frontend's example values
    (meta["example_value"]); a call without them is left alone."""
    calls = calls or config.dense_attention_inputs
    if calls == "off":
        return 0
    copied = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        operands = [node.args[position] if position < len(node.args) else node.kwargs.get(name)
                     for position, name in enumerate(_TENSOR_ARGUMENTS)]
        values = [_example(operand) for operand in operands]
        if values[0] is None or values[0].device.type not in devices:
            continue
        if calls == "training" and not any(value is not None and value.requires_grad for value in values[:3]):
            continue  # an inference call
        for position, (name, operand, value) in enumerate(zip(_TENSOR_ARGUMENTS, operands, values)):
            if value is None or value.dim() == 0 or value.stride(-1) == 1 or value.shape[-1] == 1:
                continue
            with gm.graph.inserting_before(node):
                dense = gm.graph.call_method("contiguous", (operand,))
            dense.meta.update({key: item for key, item in operand.meta.items() if key != "example_value"})
            with getattr(value, "fake_mode", None) or contextlib.nullcontext():
                dense.meta["example_value"] = value.contiguous()
            if position < len(node.args):
                node.args = (*node.args[:position], dense, *node.args[position + 1:])
            else:
                node.kwargs = {**node.kwargs, name: dense}
            copied += 1
    if copied:
        gm.recompile()
    return copied


def _example(operand):
    """The frontend's example value of a graph operand, if it is a tensor."""
    if isinstance(operand, torch.fx.Node):
        value = operand.meta.get("example_value")
        return value if isinstance(value, torch.Tensor) else None
    return None


_RANDOM_NAMES = ("rand", "bernoulli", "dropout", "normal", "multinomial", "uniform", "exponential", "poisson",
                 "cauchy", "geometric", "gumbel", "rrelu", "fractional", "attention", "seed", "empty")
_MAX_MASK_ELEMENTS = 1 << 26


def causal_masks(gm: torch.fx.GraphModule) -> int:
    """Drop every SDPA mask that depends on no graph input and is exactly torch's causal pattern (then
    the call gets `is_causal=True`) or masks nothing. Returns how many masks it dropped. A mask with
    static sizes is folded only when every node it depends on is a deterministic function call with a
    static-shaped example value that no in-place write touched (its version counter is 0), and two
    evaluations agree. A mask with symbolic sizes (a graph made dynamic after a new sequence length)
    cannot be evaluated: it is recognized by its form, `arange(S)[..., None, :] <= arange(L)[..., :, None]`
    (optionally `+ 0` and expanded), L and S the query's and key's lengths (`_causal_by_form`)."""
    if not config.causal_attention_masks:
        return 0
    patterns: dict = {}  # mask node -> ('causal' | 'none' | None, the nodes that make it)
    dropped = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        arguments = _bind_sdpa(node)
        query, key, mask = (_example(arguments.get(name)) for name in ("query", "key", "attn_mask"))
        if query is None or key is None or mask is None or arguments.get("is_causal", False) is not False:
            continue
        lengths = (query.shape[-2], key.shape[-2])
        entry = (arguments["attn_mask"], *map(str, map(_torch.sym_expr, lengths)))  # SymInts do not hash
        if entry not in patterns:
            patterns[entry] = _pattern_of(gm, arguments["attn_mask"], *lengths)
        pattern, _ = patterns[entry]
        if pattern is None:
            continue
        rest = {name: item for name, item in arguments.items() if name not in ("query", "key", "value")}
        rest.update(attn_mask=None, is_causal=pattern == "causal")
        node.args = (arguments["query"], arguments["key"], arguments["value"])
        node.kwargs = rest
        dropped += 1
    if dropped:
        for (mask, *_), (_, nodes) in patterns.items():  # the masks' own nodes, now unused: pure calls
            _erase_unused(gm, mask, nodes)
        gm.recompile()
    return dropped


def _pattern_of(gm, mask, queries, keys) -> tuple:
    """('causal' | 'none' | None, the set of nodes that compute `mask` and may be erased with it)."""
    value, needed = _fold(gm, mask)
    if value is not None:
        return _mask_pattern(value, queries, keys), needed
    nodes = _causal_by_form(mask, queries, keys)
    return ("causal", nodes) if nodes else (None, set())


def _causal_by_form(mask, queries, keys) -> set:
    """The nodes of `mask` where it is `columns <= rows` (or `rows >= columns`), possibly expanded, with
    `columns` a 0-based integer arange of the keys' length indexed into the last dimension and `rows` one
    of the queries' length into the second to last: mask[..., i, j] = j <= i, torch's is_causal pattern
    whatever the lengths. Empty where it is not that form (or a node was written in place)."""
    def same(a, b) -> bool:
        return _torch.sym_expr(a) == _torch.sym_expr(b)

    nodes = set()
    compare = mask
    if compare.op == "call_method" and compare.target == "expand" and isinstance(compare.args[0], torch.fx.Node):
        nodes.add(compare)
        compare = compare.args[0]
    if compare.op != "call_function" or len(compare.args) != 2 or compare.kwargs:
        return set()
    if compare.target in (operator.le, torch.le):
        columns, rows = compare.args
    elif compare.target in (operator.ge, torch.ge):
        rows, columns = compare.args
    else:
        return set()
    nodes.add(compare)
    shape = _example(compare).shape if _example(compare) is not None else None
    if shape is None or len(shape) < 2 or not (same(shape[-2], queries) and same(shape[-1], keys)):
        return set()
    column_nodes = _indexed_range(columns, keys, last=True)
    row_nodes = _indexed_range(rows, queries, last=False)
    if not column_nodes or not row_nodes:
        return set()
    nodes |= column_nodes | row_nodes
    if any(_example(node) is None or _example(node)._version != 0 for node in nodes):
        return set()
    return nodes


def _indexed_range(node, length, last: bool) -> set:
    """The nodes of `arange(length)[index]` (optionally `+ 0` before indexing), the index made of Nones and
    one full slice, placing the range in the last dimension (`last`) or the second to last, all others 1."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.target is not operator.getitem:
        return set()
    example, index = _example(node), node.args[1]
    if example is None or not isinstance(index, tuple) or sum(isinstance(item, slice) for item in index) != 1:
        return set()
    if any(item is not None and item != slice(None) for item in index):
        return set()
    position = -1 if last else -2
    if len(example.shape) < 2 or _torch.sym_expr(example.shape[position]) != _torch.sym_expr(length):
        return set()
    if any(_torch.sym_expr(size) != 1 for axis, size in enumerate(example.shape)
           if axis != len(example.shape) + position):
        return set()
    nodes, source = {node}, node.args[0]
    if (isinstance(source, torch.fx.Node) and source.op == "call_function" and source.target in (operator.add, torch.add)
            and len(source.args) == 2 and not source.kwargs):
        zero = [item for item in source.args if not isinstance(item, torch.fx.Node)]
        inner = [item for item in source.args if isinstance(item, torch.fx.Node)]
        if zero != [0] or len(inner) != 1:
            return set()
        nodes.add(source)
        source = inner[0]
    if not (isinstance(source, torch.fx.Node) and source.op == "call_function" and source.target is torch.arange):
        return set()
    start_end = list(source.args)
    if len(start_end) == 1:
        start_end = [0, start_end[0]]
    if len(start_end) == 3 and start_end[2] == 1:
        start_end = start_end[:2]
    if (len(start_end) != 2 or start_end[0] != 0 or set(source.kwargs) - {"device", "dtype"}
            or _example(source) is None or _example(source).dtype.is_floating_point or _example(source).dim() != 1):
        return set()
    return nodes | {source}


def _bind_sdpa(node) -> dict:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    arguments = dict(zip(names, node.args))
    arguments.update(node.kwargs)
    return arguments


def _fold(gm, mask) -> tuple:
    """(The value of `mask` computed now, the nodes computing it), or (None, empty) unless it is a
    constant of the graph (see causal_masks)."""
    needed, stack = set(), [mask]
    while stack:
        node = stack.pop()
        if node in needed:
            continue
        example = node.meta.get("example_value")
        if (node.op not in ("call_function", "call_method") or not isinstance(example, torch.Tensor)
                or not all(isinstance(size, int) for size in (*example.shape, *example.stride()))
                or _is_random(node) or example._version != 0 or example.numel() > _MAX_MASK_ELEMENTS):
            return None, set()
        if not all(isinstance(item, _CONSTANTS) for item in torch.utils._pytree.tree_leaves((node.args, node.kwargs))):
            return None, set()
        needed.add(node)
        stack.extend(node.all_input_nodes)
    # Run twice from two random states: a value that a random draw the name check missed would differ.
    first, second = _evaluate(gm, needed, mask, seed=0), _evaluate(gm, needed, mask, seed=1)
    if first is None or second is None or not torch.equal(first, second):
        return None, set()
    return first, needed


def _evaluate(gm, needed: set, mask, seed: int):
    """The value of `mask`, computed from the `needed` nodes now (None if a call fails or disagrees with its
    example value)."""
    values: dict = {}
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=_cuda_devices()):
            torch.manual_seed(seed)
            for node in gm.graph.nodes:
                if node not in needed:
                    continue
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
                if node.op == "call_method":
                    value = getattr(args[0], node.target)(*args[1:], **kwargs)
                else:
                    value = node.target(*args, **kwargs)
                example = node.meta["example_value"]
                if (not isinstance(value, torch.Tensor) or value.shape != example.shape
                        or value.dtype != example.dtype or value.device != example.device):
                    return None
                values[node] = value
    except Exception:  # a call that cannot run outside the trace: leave the mask alone
        return None
    return values[mask]


def _cuda_devices() -> list:
    return list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []


_CONSTANTS = (int, float, bool, type(None), slice, torch.device, torch.dtype, str, torch.fx.Node)


def _is_random(node) -> bool:
    """Whether the node's call may draw random numbers or read uninitialized memory (judged by its name)."""
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    return node.target is not operator.getitem and any(word in name.lower() for word in _RANDOM_NAMES)


def _mask_pattern(mask: torch.Tensor, queries: int, keys: int) -> str | None:
    """'causal' where `mask` is torch's is_causal pattern for `queries` x `keys` scores, 'none' where it
    masks nothing, else None. A float mask is 0 where attention is kept and -inf (or the dtype's lowest
    finite value, which softmax turns into the same 0) where it is not."""
    if mask.dim() < 2 or mask.shape[-2] not in (1, queries) or mask.shape[-1] not in (1, keys):
        return None
    if mask.dtype == torch.bool:
        kept = mask
    elif mask.is_floating_point():
        if not bool(((mask == 0) | (mask <= torch.finfo(mask.dtype).min)).all()):
            return None
        kept = mask == 0
    else:
        return None
    if bool(kept.all()):
        return "none"
    causal = torch.ones(queries, keys, dtype=torch.bool, device=mask.device).tril()
    if kept.shape[-2:] == causal.shape and bool((kept == causal).all()):
        return "causal"
    return None


def _erase_unused(gm, node, erasable: set) -> None:
    """Erase `node` if nothing uses it, then its inputs likewise, only ever nodes of `erasable`."""
    if node not in erasable or node.users or node.graph is not gm.graph:
        return
    inputs = node.all_input_nodes
    gm.graph.erase_node(node)
    for item in inputs:
        _erase_unused(gm, item, erasable)
