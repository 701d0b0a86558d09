"""Large CPU buffers backed by transparent huge pages.

A fresh CPU buffer of many megabytes comes from the kernel as untouched 4 KiB
pages; the first write to each page faults, and on a virtual machine those faults
cost more than the arithmetic: 64 MiB written by `torch.empty(...).fill_(1)`
took 18 ms on the 2-core benchmark machine, and 4.5 ms once the range was
advised MADV_HUGEPAGE (2 MiB pages, 512 times fewer faults). Linux's default
transparent-huge-page mode, "madvise", only gives huge pages to ranges that ask.

Only large buffers: glibc serves allocations below its largest mmap threshold (32 MiB)
from its heap, where a model's buffers are reused call after call, already faulted in;
advising those ranges made Linux's khugepaged collapse them into huge pages in the
background, copying memory on the 2-core machine while kiln ran (softmax on 2048 x 2048:
p80 2.2 ms advised, 1.6 ms not). Larger buffers are fresh mappings on every call.
So kiln allocates CPU buffers of at least `config.cpu_huge_pages_min_bytes` (32 MiB) with
`empty_strided_huge`: torch's allocator as usual, then one `madvise` over the
whole 2 MiB pages inside the buffer, before anything touches them. Advice changes
no contents, so a buffer that came from reused (already touched) memory is still
correct; where madvise is missing (not Linux) the helper is torch.empty_strided.
"""
from __future__ import annotations

import ctypes
import sys

import torch

HUGE_PAGE_BYTES = 1 << 21
MADV_HUGEPAGE = 14  # linux/mman.h


def _find_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_madvise = _find_madvise()


def advise_huge_pages(tensor: torch.Tensor) -> bool:
    """Ask for huge pages over the whole 2 MiB pages of `tensor`'s storage; True if advised."""
    if _madvise is None:
        return False
    start = tensor.untyped_storage().data_ptr()
    first = (start + HUGE_PAGE_BYTES - 1) & ~(HUGE_PAGE_BYTES - 1)
    end = (start + tensor.untyped_storage().nbytes()) & ~(HUGE_PAGE_BYTES - 1)
    return end > first and _madvise(first, end - first, MADV_HUGEPAGE) == 0


def empty_strided_huge(size, stride, dtype: torch.dtype) -> torch.Tensor:
    """torch.empty_strided on the CPU, with the buffer's whole 2 MiB pages advised as huge pages."""
    tensor = torch.empty_strided(size, stride, dtype=dtype, device="cpu")
    advise_huge_pages(tensor)
    return tensor
