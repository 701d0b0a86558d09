"""Large CPU buffers backed by transparent huge pages.

A fresh CPU buffer of many megabytes comes from the kernel as untouched 4 KiB
pages; the first write to each page faults, and on a virtual machine those faults
cost more than the arithmetic. A range advised MADV_HUGEPAGE takes 2 MiB pages, 512 times
fewer faults, and a first write to it is several times quicker (see
benchmarks/results/2026-12-02_docstring-measurements.md). Linux's default
transparent-huge-page mode, "madvise", only gives huge pages to ranges that ask.

Only large, untouched memory. Below glibc's largest mmap threshold (32 MiB) a buffer may
come back from its heap already faulted in (a model's buffers are reused call after call):
advising such ranges made Linux's khugepaged collapse them in the background, and with a
4 MiB threshold the C++ kernel benchmarks ran slower (layer_norm 2048 x 2048: see
benchmarks/results/2026-11-30_cpu-final-rounds3-c_amd-epyc-2core.md, with 4 MiB, against
2026-11-30_cpu-kernels-32mib-check_amd-epyc-2core.md, with 32 MiB). So `empty_strided_huge` serves
CPU buffers of at least `config.cpu_huge_pages_min_bytes` (32 MiB), and also asks `mincore`
whether the first whole 2 MiB page is resident: only an untouched range is advised, with
one `madvise` over the whole 2 MiB pages inside the buffer, before anything touches them.
Advice changes no contents, so either way the buffer is ordinary memory; where madvise or
mincore is missing (not Linux) the helper is torch.empty_strided.
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
