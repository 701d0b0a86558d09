"""The scratch block of a compiled CPU graph (planned by kiln/schedule/memory.py, built by
kiln/runtime/scratch.py): the plan never lets two live buffers share bytes, calls never see each
other's values, outputs never live in it."""
from __future__ import annotations

import random

import pytest
import torch

import kiln
from kiln.runtime.scratch import ScratchArena
from kiln.schedule.memory import ALIGNMENT, plan_offsets
from tests.backend.test_pipeline import compiled_graphs


def test_plan_shares_bytes_only_between_buffers_that_are_never_live_together():
    generator = random.Random(0)
    for _ in range(200):
        buffers = []
        for index in range(generator.randint(1, 12)):
            first = generator.randint(0, 20)
            buffers.append((f"buf{index}", generator.randint(1, 5000), first, first + generator.randint(0, 6)))
        offsets, total = plan_offsets(buffers)
        for name, nbytes, first, last in buffers:
            assert offsets[name] % ALIGNMENT == 0 and offsets[name] + nbytes <= total
        for a_name, a_bytes, a_first, a_last in buffers:
            for b_name, b_bytes, b_first, b_last in buffers:
                if a_name >= b_name or a_last < b_first or b_last < a_first:
                    continue  # the same buffer, or lifetimes apart: sharing is allowed
                a_start, b_start = offsets[a_name], offsets[b_name]
                assert a_start + a_bytes <= b_start or b_start + b_bytes <= a_start, (buffers, offsets)


def test_plan_reuses_the_bytes_of_dead_buffers():
    # A chain a -> b -> c -> d where each buffer dies when the next one is written: two slots.
    buffers = [("a", 4096, 0, 1), ("b", 4096, 1, 2), ("c", 4096, 2, 3), ("d", 4096, 3, 4)]
    offsets, total = plan_offsets(buffers)
    assert total == 2 * 4096 and offsets["a"] == offsets["c"] and offsets["b"] == offsets["d"]


def test_a_call_that_starts_while_another_holds_the_block_gets_its_own():
    arena = ScratchArena(256, [(0, (8,), (1,), torch.float32), (64, (4, 4), (4, 1), torch.float64)])
    first, second = arena.acquire(), arena.acquire()
    assert first[0].data_ptr() != second[0].data_ptr()
    assert first[1].shape == (4, 4) and first[1].dtype == torch.float64
    assert first[1].data_ptr() - first[0].data_ptr() == 64
    arena.release(first)
    assert arena.acquire() is first


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_compiled_graph_keeps_intermediates_in_its_block_and_outputs_outside(cpu_backend):
    weight = torch.randn(48, 48)

    def fn(x):
        hidden = torch.relu(x @ weight) * 2  # a product and a kernel output: intermediates
        hidden = torch.softmax(hidden @ weight, -1)
        return hidden.sum(-1), torch.tanh(hidden) + 1

    x = torch.randn(16, 48)
    with kiln.config.patch(cpu_backend=cpu_backend):
        _, (graph,) = compiled_graphs(fn, x)
        wrapper = graph.module_source.wrapper
        assert "_arena.acquire()" in wrapper and "_scratch[" in wrapper
        outputs = []
        for _ in range(3):  # new values each call: a value left over from the last call shows
            x = torch.randn(16, 48)
            result = graph([x, weight])  # the graph's inputs: x, then the lifted global
            expected = fn(x)
            for got, want in zip(result, expected):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            outputs.append((result, expected))
        for result, expected in outputs:  # later calls did not write into earlier outputs
            for got, want in zip(result, expected):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        block = graph.module_source.constants["_arena"]
        views = block.acquire()
        block_start = views[0].untyped_storage().data_ptr()
        for got in outputs[-1][0]:
            assert not block_start <= got.data_ptr() < block_start + block.nbytes
        block.release(views)


def test_scratch_arena_can_be_turned_off():
    with kiln.config.patch(cpu_scratch_arena=False):
        _, (graph,) = compiled_graphs(lambda x: torch.relu(x * 2).sum(0) + 1, torch.randn(64, 64))
    assert "_arena" not in graph.module_source.wrapper


def test_view_at_counts_the_offset_from_the_tensors_own_start():
    # The wrappers' view_at is torch's C++ _reinterpret_tensor where torch has it: it must build
    # the same view as the Python definition, for tensors that are themselves offset views.
    from kiln.runtime.support import _view_at, view_at

    base = torch.arange(40.0)[7:]
    for size, stride, offset in [((2, 3), (3, 1), 3), ((5,), (2,), 0), ((2, 2), (1, 2), 1)]:
        got, want = view_at(base, size, stride, offset), _view_at(base, size, stride, offset)
        assert got.storage_offset() == want.storage_offset() and got.stride() == want.stride()
        assert torch.equal(got, want)


def test_a_cuda_block_is_handed_again_only_on_the_stream_it_was_last_used_on(monkeypatch):
    """A CUDA block given back may still be in use by work in flight: only a call on the same stream
    (whose work runs after it) may take it again. (On "meta" memory, with the stream faked.)"""
    from kiln import _torch

    stream = {"now": 7}
    monkeypatch.setattr(_torch, "current_cuda_stream", lambda index: stream["now"])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: stream.get("capturing", False))
    arena = ScratchArena(256, [(0, (8,), (1,), torch.float32), (64, (4, 4), (4, 1), torch.float16)], "meta")
    first = arena.acquire()
    assert first[0].device.type == "meta" and first[1].dtype == torch.float16
    arena.release(first)
    stream["now"] = 9
    other = arena.acquire()
    assert other is not first  # another stream: a block of its own
    arena.release(other)
    stream["now"] = 7
    assert arena.acquire() is first
    stream["capturing"] = True  # recorded into a CUDA graph: a block of its own, never handed on
    captured = arena.acquire()
    assert captured is not first and captured is not other
    arena.release(captured)
    stream["capturing"] = False
    assert all(views is not captured for _, views in arena.idle)
    import pickle

    copy = pickle.loads(pickle.dumps(arena))  # the graph cache keeps the plan, never a block
    assert copy.idle == [] and copy.device == "meta" and copy.layouts == arena.layouts


def test_cuda_scratch_blocks_are_for_inference_graphs_on_one_gpu_only():
    from kiln.schedule import memory

    class _Buffer:
        def __init__(self, device):
            self.device = torch.device(device)

    class _Graph:
        def __init__(self, *devices):
            self.buffers = {f"b{index}": _Buffer(device) for index, device in enumerate(devices)}

    class _Scheduled:
        def __init__(self, *devices):
            self.graph = _Graph(*devices)

    with kiln.config.patch(cuda_scratch_arena=True):
        for graph, inference in ((_Scheduled("cuda:0"), False), (_Scheduled("cuda:0", "cuda:1"), True)):
            assert memory._plan_scratch(graph, {}, "cuda", inference) == (None, {})
    with kiln.config.patch(cuda_scratch_arena=False):
        assert memory._plan_scratch(_Scheduled("cuda:0"), {}, "cuda", True) == (None, {})
