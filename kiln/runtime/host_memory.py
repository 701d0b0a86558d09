"""Large CPU buffers backed by transparent huge pages.

A fresh CPU buffer of many megabytes comes from the kernel as untouched 4 KiB
pages; the first write to each page faults, and on a virtual machine those faults
cost more than the arithmetic: 64 MiB written by `torch.empty(...).fill_(1)`
took 18 ms on the 2-core benchmark machine, and 4.5 ms once the range was
advised MADV_HUGEPAGE (2 MiB pages, 512 times fewer faults). Linux's default
transparent-huge-page mode, "madvise", only gives huge pages to ranges that ask.

Only memory not yet touched: glibc may hand back a buffer from its heap, already faulted
in (a model's buffers are often reused call after call); advising such a range made
Linux's khugepaged collapse it into huge pages in the background, copying memory on the
2-core machine while kiln ran. Whether a 16 MiB buffer is a fresh mapping or reused heap
memory depends on glibc's state, which differs from one process to the next: softmax on
2048 x 2048 ran at 1.7 ms in some processes and 2.6 ms in others, for eager, Inductor and
kiln alike. So `empty_strided_huge` (for CPU buffers of at least
`config.cpu_huge_pages_min_bytes`) asks `mincore` whether the first whole 2 MiB page of the
buffer is resident: if not, the range is fresh and one `madvise` covers the whole 2 MiB
pages inside the buffer before anything touches them; if so, it is left alone. Advice
changes no contents, so either way the buffer is ordinary memory; where madvise or mincore
is missing (not Linux) the helper is torch.empty_strided.
"""
from __future__ import annotations

import ctypes
import sys

import torch

HUGE_PAGE_BYTES = 1 << 21
MADV_HUGEPAGE = 14  # linux/mman.h


def _find_libc_calls():
    if not sys.platform.startswith("linux"):
        return None, None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise, mincore = libc.madvise, libc.mincore
    except (OSError, AttributeError):
        return None, None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    mincore.restype = ctypes.c_int
    return madvise, mincore


_madvise, _mincore = _find_libc_calls()
_resident = (ctypes.c_ubyte * 1)()


def advise_huge_pages(tensor: torch.Tensor) -> bool:
    """Ask for huge pages over the whole 2 MiB pages of `tensor`'s storage when they are not yet
    touched; True if advised."""
    if _madvise is None:
        return False
    start = tensor.untyped_storage().data_ptr()
    first = (start + HUGE_PAGE_BYTES - 1) & ~(HUGE_PAGE_BYTES - 1)
    end = (start + tensor.untyped_storage().nbytes()) & ~(HUGE_PAGE_BYTES - 1)
    if end <= first or _mincore(first, 4096, _resident) != 0 or _resident[0] & 1:
        return False  # no whole huge page inside, or memory already in use (reused heap)
    return _madvise(first, end - first, MADV_HUGEPAGE) == 0


def empty_strided_huge(size, stride, dtype: torch.dtype) -> torch.Tensor:
    """torch.empty_strided on the CPU, with the buffer's whole 2 MiB pages advised as huge pages."""
    tensor = torch.empty_strided(size, stride, dtype=dtype, device="cpu")
    advise_huge_pages(tensor)
    return tensor
