"""kiln/runtime/heap.py: the heap alive before a compile is frozen out of gc's scans while it runs, and only then."""
from __future__ import annotations

import gc

import torch

import kiln
from kiln.runtime.heap import frozen_heap


def test_the_outermost_compile_freezes_and_unfreezes():
    assert gc.get_freeze_count() == 0
    before = [object() for _ in range(10)]
    with frozen_heap():
        frozen = gc.get_freeze_count()
        assert frozen > len(before)
        made_since = [[] for _ in range(1000)]  # tracked objects in the young generation
        with frozen_heap():  # a nested compile (a graph break's callee) freezes nothing more
            assert gc.get_freeze_count() <= frozen  # (frozen objects freed by refcount leave it)
        assert gc.get_freeze_count() <= frozen
    assert gc.get_freeze_count() == 0
    del made_since


def test_a_programs_own_freeze_and_the_option_are_respected():
    with kiln.config.patch(compile_gc_freeze=False), frozen_heap():
        assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        made_since = [[] for _ in range(1000)]  # tracked objects a second freeze would add
        with frozen_heap():
            assert 0 < gc.get_freeze_count() <= count  # (frozen objects freed by refcount leave it)
        assert 0 < gc.get_freeze_count() <= count  # kiln did not unfreeze what the program froze
        del made_since
    finally:
        gc.unfreeze()


def test_a_failing_compile_unfreezes_and_cycles_made_before_it_are_collected_after():
    class Cycle:
        pass

    cycle = Cycle()
    cycle.self = cycle
    del cycle
    try:
        with frozen_heap():
            raise RuntimeError("the compile failed")
    except RuntimeError:
        pass
    assert gc.get_freeze_count() == 0
    assert gc.collect() >= 1  # the cycle made before the compile was not kept alive by the freeze


def test_kiln_compile_freezes_the_heap_while_it_compiles_only(monkeypatch):
    import kiln.lowering

    seen, lower_graph = [], kiln.lowering.lower_graph

    def recording(*args, **kwargs):
        seen.append(gc.get_freeze_count())
        return lower_graph(*args, **kwargs)

    monkeypatch.setattr(kiln.lowering, "lower_graph", recording)
    x = torch.randn(8)
    torch.testing.assert_close(kiln.compile(lambda x: torch.sin(x) + 1)(x), torch.sin(x) + 1)
    assert len(seen) == 1 and seen[0] > 0
    assert gc.get_freeze_count() == 0 and gc.isenabled()
