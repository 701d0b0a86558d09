"""Large CPU buffers with transparent huge pages (kiln/runtime/host_memory.py)."""
from __future__ import annotations

import mmap
import sys

import pytest
import torch

import kiln
from kiln.runtime import host_memory
from tests.backend.test_pipeline import assert_matches

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc are Linux's")


def _vm_flags_at(address: int) -> list:
    """The VmFlags of the mapping that holds `address` (from /proc/self/smaps)."""
    flags, inside = None, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" not in fields[0]:
                start, end = (int(part, 16) for part in fields[0].split("-"))
                inside = start <= address < end
            elif inside and fields[0] == "VmFlags:":
                flags = fields[1:]
                break
    return flags


@linux_only
def test_untouched_memory_is_advised_huge_and_a_small_buffer_is_left_alone():
    # A fresh anonymous mapping is untouched memory, whatever state glibc's heap is in (an
    # allocation of any size may be served from a free heap chunk, already touched).
    region = mmap.mmap(-1, 12 << 20)
    tensor = torch.frombuffer(region, dtype=torch.float32)
    assert host_memory.advise_huge_pages(tensor)
    first_huge_page = (tensor.data_ptr() + host_memory.HUGE_PAGE_BYTES - 1) & ~(host_memory.HUGE_PAGE_BYTES - 1)
    assert "hg" in _vm_flags_at(first_huge_page)
    tensor.fill_(2.5)  # the memory is ordinary memory
    assert float(tensor.sum()) == 2.5 * 3 * (1 << 20)
    assert not host_memory.advise_huge_pages(torch.empty(1000))  # no whole 2 MiB page inside
    del tensor


def test_empty_strided_huge_is_an_ordinary_tensor():
    tensor = host_memory.empty_strided_huge((10, 1 << 20), (1 << 20, 1), torch.float32)
    assert tensor.shape == (10, 1 << 20) and tensor.stride() == (1 << 20, 1) and tensor.dtype == torch.float32
    tensor.fill_(2.5)
    assert float(tensor.sum()) == 2.5 * 10 * (1 << 20)


@linux_only
def test_memory_already_in_use_is_not_advised():
    # Touched pages (a buffer glibc hands back from its heap) would only be collapsed into huge
    # pages by khugepaged in the background: they are left alone.
    touched = torch.empty(3 << 20).fill_(1.0)  # 12 MiB, every page written
    assert not host_memory.advise_huge_pages(touched)


def test_large_outputs_of_kernels_and_products_are_allocated_with_huge_pages():
    fn = lambda x, w: (torch.sin(x) + 1, x @ w)  # noqa: E731
    x, w = torch.randn(1024, 1024), torch.randn(1024, 2048)  # 4 MiB and 8 MiB outputs
    with kiln.config.patch(cpu_huge_pages_min_bytes=4 << 20, cpu_gemm="aten"):  # oneDNN's linear has no out=
        (graph,) = assert_matches(fn, x, w)
    assert graph.module_source.wrapper.count("empty_strided_huge(") == 2  # (advised if untouched)
    with kiln.config.patch(cpu_huge_pages_min_bytes=0, cpu_gemm="aten"):
        (graph,) = assert_matches(fn, x, w)
    assert "empty_strided_huge(" not in graph.module_source.wrapper
