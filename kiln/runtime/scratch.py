"""One compiled graph's CPU intermediates in one block of memory, reused by every call.

On the CPU every `torch.empty` of a large buffer is a malloc, and glibc hands large blocks
back to the kernel (munmap, heap trim) and takes them again: the next call's first writes
page-fault, on every call (a 4-layer BERT's faults per call and kernel time with and without
the block: see benchmarks/results/2026-12-02_docstring-measurements.md). The memory plan
(kiln/schedule/memory.py, `plan_offsets`) instead places the intermediates that the wrapper
allocates (kernel outputs and `out=` extern outputs, of static size, that no graph output
aliases) at offsets of one block planned from their lifetimes, so buffers whose lifetimes do
not overlap share memory; this module builds the block and its views, once.

A call takes a block with `acquire()` and gives it back with `release()`; a call that
starts while another holds the block (another thread, or a re-entrant call) builds its
own, so no two running calls share memory. At most `KEEP` idle blocks are kept.
"""
from __future__ import annotations

import torch

KEEP = 2


class ScratchArena:
    """The planned block of one compiled graph; `layouts` are (offset bytes, size, stride, dtype)."""

    def __init__(self, nbytes: int, layouts: list):
        self.nbytes = nbytes
        self.layouts = layouts
        self.idle: list = []

    def _build(self) -> list:
        from kiln.config import config
        from kiln.runtime.host_memory import empty_strided_huge

        if 0 < config.cpu_huge_pages_min_bytes <= self.nbytes:
            block = empty_strided_huge((self.nbytes,), (1,), torch.uint8)
        else:
            block = torch.empty(self.nbytes, dtype=torch.uint8)
        storage = block.untyped_storage()
        views = []
        for offset, size, stride, dtype in self.layouts:
            view = torch.empty(0, dtype=dtype)
            view.set_(storage, offset // dtype.itemsize, size, stride)
            views.append(view)
        return views

    def acquire(self) -> list:
        try:
            return self.idle.pop()
        except IndexError:
            return self._build()

    def release(self, views: list) -> None:
        if len(self.idle) < KEEP:
            self.idle.append(views)

    def __repr__(self) -> str:
        return f"ScratchArena({self.nbytes} bytes, {len(self.layouts)} buffers)"
