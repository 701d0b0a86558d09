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

On CUDA (an inference graph's block, `config.cuda_scratch_arena`) the wrapper only enqueues its
kernels: a block given back may still be read and written by work in flight. Work enqueued later on
the same stream runs after it, so a block is handed again only to a call on the stream it was last
used on; a call on another stream builds its own (as the caching allocator keeps a block to its
stream). A call recorded into a CUDA graph (mode="reduce-overhead") builds a block that the graph
keeps: every replay writes it, so it is never handed to another call.
"""
from __future__ import annotations

import torch

KEEP = 2


class ScratchArena:
    """The planned block of one compiled graph; `layouts` are (offset bytes, size, stride, dtype)."""

    def __init__(self, nbytes: int, layouts: list, device: str = "cpu"):
        self.nbytes = nbytes
        self.layouts = layouts
        self.device = device
        self.idle: list = []  # CPU: blocks' views; CUDA: (stream, views)
        self._index = None if device == "cpu" else torch.device(device).index

    def __reduce__(self):  # the whole-graph cache keeps the plan, never a block
        return ScratchArena, (self.nbytes, self.layouts, self.device)

    def _build(self) -> list:
        from kiln.config import config
        from kiln.runtime.host_memory import empty_strided_huge

        if self.device != "cpu":
            block = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        elif 0 < config.cpu_huge_pages_min_bytes <= self.nbytes:
            block = empty_strided_huge((self.nbytes,), (1,), torch.uint8)
        else:
            block = torch.empty(self.nbytes, dtype=torch.uint8)
        storage = block.untyped_storage()
        views = []
        for offset, size, stride, dtype in self.layouts:
            view = torch.empty(0, dtype=dtype, device=self.device)
            view.set_(storage, offset // dtype.itemsize, size, stride)
            views.append(view)
        return views

    def acquire(self) -> list:
        if self.device == "cpu":
            try:
                return self.idle.pop()
            except IndexError:
                return self._build()
        from kiln import _torch

        if torch.cuda.is_current_stream_capturing():
            return self._build()  # a CUDA graph's own block (its pool's): it writes there at every replay
        stream = _torch.current_cuda_stream(self._index)
        for index in range(len(self.idle) - 1, -1, -1):
            if self.idle[index][0] == stream:
                return self.idle.pop(index)[1]
        return self._build()

    def release(self, views: list) -> None:
        if len(self.idle) >= KEEP:
            return
        if self.device == "cpu":
            self.idle.append(views)
        elif not torch.cuda.is_current_stream_capturing():  # a captured block stays the graph's alone
            from kiln import _torch

            self.idle.append((_torch.current_cuda_stream(self._index), views))

    def __repr__(self) -> str:
        where = "" if self.device == "cpu" else f" on {self.device}"
        return f"ScratchArena({self.nbytes} bytes, {len(self.layouts)} buffers{where})"
