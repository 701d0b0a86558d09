"""kiln/aot: torch-level FX graph -> functional ATen graph(s) through AOTAutograd.

`aot_compile(gm, example_inputs, compile_aten)` functionalizes and decomposes the
graph with kiln's decomposition table (kiln/aot/decompositions.py) and hands each
resulting ATen graph (forward, and backward when training) to `compile_aten`.
AOTAutograd's tracing is not thread-safe (torch.fx's patcher is module state), so the trace
and every compile it calls back, a backward compiled lazily at its first use included, hold
the process's compile lock (kiln/runtime/locks.py). Before compiling, each ATen graph's
fake metas get eager's strides where torch's meta kernels, functionalization's rewrite of
in-place writes or a composite op's decomposition disagree with eager's (kiln/aot/strides.py).
A training graph's joint forward and backward are split by `config.partitioner`: which forward
values the backward reads from memory and which it recomputes (kiln/_torch.py partition_function).
Before tracing, CUDA attention calls lose masks that are constant causal patterns (`config.causal_attention_masks`)
and get inputs that the fused SDPA kernels accept (kiln/aot/attention.py, `config.dense_attention_inputs`). An inference graph's 2-D convolutions are then laid out
channels-last where `config.conv_layout` says so (kiln/aot/layouts.py), and its duplicate nodes (autocast's
casts of one tensor for several products) are merged (kiln/aot/cse.py): AOTAutograd's partitioner does
that for a training graph's joint trace, nothing does it for an inference graph. Dropout is drawn in kiln's
kernels (kiln/aot/random.py): in an inference graph before it compiles, in a training graph's pair right after the
partitioner, whose saved masks become seeds the backward expands again. The partitioner's pair is tagged
with its parts (`training_role`): CUDA graphs treat a forward's tensors saved for the backward, and a
backward's gradients, apart from the results a caller reads (kiln/runtime/cudagraphs.py).
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from kiln import _torch
from kiln.config import config
from kiln.aot.attention import causal_masks, make_attention_fusable
from kiln.aot.cse import merge_duplicates
from kiln.aot.decompositions import decomposition_table
from kiln.aot.layouts import channels_last_training_convs, choose_conv_layouts
from kiln.aot.mutations import batch_input_copies
from kiln.aot.random import partition as with_dropout_seeds, rewrite_forward as dropouts_in_kernels
from kiln.aot.strides import expand_writes_as_views, keep_written_layouts, restride_to_eager, tag_torch_graph
from kiln.runtime.locks import compile_lock


def aot_compile(gm, example_inputs, compile_aten: Callable, compile_inference: Callable | None = None, *,
                plain: bool = False) -> Callable:
    """Trace `gm` to ATen with AOTAutograd and compile every graph it yields with `compile_aten`
    (an inference graph, one with no backward, with `compile_inference` when given). `plain`: `gm` is a plain
    inference graph (kiln/aot/plain.py), traced once without AOTAutograd where that trace allows."""
    from kiln.aot import plain as plain_graphs

    expand_writes_as_views(gm)  # a write through an expand that broadcasts nothing is a plain view's write
    keep_written_layouts(gm)  # in-place writes keep the written tensor's layout in the trace too
    causal_masks(gm)  # constant causal masks become is_causal=True (config.causal_attention_masks)
    make_attention_fusable(gm)  # SDPA calls (config.dense_attention_inputs) get inputs the fused kernels accept
    channels_last_training_convs(gm)  # config.conv_layout_training: NHWC through the joint trace
    facts = tag_torch_graph(gm)  # before tracing: the ATen nodes inherit the tags

    def boxed(aten_gm, aten_inputs, compile_one=compile_aten, forward=True, inference=False):
        with compile_lock:
            # kiln's buffers and output strides follow these metas
            restride_to_eager(aten_gm, facts if forward else None)
            choose_conv_layouts(aten_gm, inference=inference)
            if inference:
                dropouts_in_kernels(aten_gm)  # a training graph's forward: in the partitioner (its backward too)
                merge_duplicates(aten_gm)
            batch_input_copies(aten_gm)  # the input mutations kept in the graph: one _foreach_copy_ per dtype
            compiled = compile_one(aten_gm, aten_inputs)
        if getattr(compiled, "_boxed_call", False):
            return compiled
        return _torch.make_boxed_func(compiled)

    inference = functools.partial(boxed, compile_one=compile_inference or compile_aten, inference=True)
    if plain:
        with compile_lock:
            traced = plain_graphs.trace_to_aten(gm, example_inputs, decomposition_table())
            if traced is not None:
                return plain_graphs.runtime_wrapper(inference(*traced), {"autocast": _torch.autocast_state()})
    partition_function = _torch.partition_function(config.partitioner)
    with compile_lock:
        compiled = _torch.aot_module_simplified(gm, example_inputs, fw_compiler=boxed,
                                                bw_compiler=functools.partial(boxed, forward=False),
                                                inference_compiler=inference, decompositions=decomposition_table(),
                                                keep_inference_input_mutations=True,  # kiln/aot/mutations.py
                                                partition_fn=_tagged(with_dropout_seeds(partition_function)))
    _torch.count_aot_autograd_call()
    return compiled


# The meta keys that tag a training step's pair (`_tagged`); GraphModule.meta survives AOTAutograd's deepcopy of
# the backward and reaches compile_aten_graph.
SAVED_FROM = "kiln_saved_from"  # a forward: its outputs from this position on are saved for the backward
FORWARD_OUTPUTS = "kiln_forward_outputs"  # a forward: how many outputs it had when the partitioner tagged it
BACKWARD = "kiln_backward"  # a backward: True


def _tagged(partition_fn: Callable) -> Callable:
    """`partition_fn` (AOTAutograd's signature), with its forward and backward tagged (`training_role`)."""

    @functools.wraps(partition_fn)
    def partition_and_tag(joint_module, joint_inputs, **kwargs):
        forward, backward = partition_fn(joint_module, joint_inputs, **kwargs)
        if "num_fwd_outputs" in kwargs:  # the outputs before it are the user's (AOTAutograd passes it by name)
            forward.meta[SAVED_FROM] = kwargs["num_fwd_outputs"]
            forward.meta[FORWARD_OUTPUTS] = len(forward.graph.output_node().args[0])
        backward.meta[BACKWARD] = True
        return forward, backward

    return partition_and_tag


def training_role(gm: torch.fx.GraphModule) -> dict:
    """The part `gm` plays in a training step, as `_tagged` recorded it: {"saved_from": n} for a forward whose
    outputs from n on are saved for the backward (those before, the user's), {"backward": True, "tangents": its
    inputs' positions that are tangents} for a backward,
    {} where that is unknown: an inference graph, or a forward whose outputs changed after the partitioner
    (AOTAutograd drops effect tokens, or inlines saved-tensor hooks, there), which tells no more which are saved."""
    if gm.meta.get(BACKWARD):
        return {"backward": True, "tangents": _torch.tangent_positions(gm)}
    saved_from = gm.meta.get(SAVED_FROM)
    if saved_from is None or gm.meta.get(FORWARD_OUTPUTS) != len(gm.graph.output_node().args[0]):
        return {}
    return {"saved_from": saved_from}
