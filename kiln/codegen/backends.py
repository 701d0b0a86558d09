"""The one registry of kernel backends, by device type: `backend_for(device_type)`.

- cuda: Triton (kiln/codegen/triton.py, compiled by Triton);
- cpu: `config.cpu_backend` picks C++/OpenMP ("cpp", kiln/codegen/cpp.py) or Triton ("triton",
  the same kernels under Triton's interpreter).

The wrapper, the loader and the pipeline ask it; nothing else chooses a backend. Each backend is
a KernelBackend (kiln/codegen/common.py). It lives beside common.py, not in it, because the
backends import common.py's helpers. How to add one: docs/design/backends.md.
"""
from __future__ import annotations

from typing import Callable

from kiln.codegen.common import KernelBackend
from kiln.codegen.cpp import CppBackend
from kiln.codegen.triton import TritonBackend
from kiln.config import config

CPU_BACKENDS: dict[str, KernelBackend] = {"cpp": CppBackend(), "triton": TritonBackend("cpu")}
CUDA_BACKEND: KernelBackend = TritonBackend("cuda")


def _cpu_backend() -> KernelBackend:
    if config.cpu_backend not in CPU_BACKENDS:
        raise ValueError(f"unknown cpu_backend {config.cpu_backend!r} (KILN_CPU_BACKEND): "
                         f"choose one of {', '.join(sorted(CPU_BACKENDS))}")
    return CPU_BACKENDS[config.cpu_backend]


# Device type -> the function that picks its backend under the current config.
DEVICE_BACKENDS: dict[str, Callable[[], KernelBackend]] = {
    "cuda": lambda: CUDA_BACKEND,
    "cpu": _cpu_backend,
}


def backend_for(device_type: str) -> KernelBackend:
    """The kernel backend for tensors of `device_type` ("cuda", "cpu"), as config sets it now."""
    if device_type not in DEVICE_BACKENDS:
        raise ValueError(f"kiln has no kernel backend for device type {device_type!r}; "
                         f"registered device types: {', '.join(sorted(DEVICE_BACKENDS))}")
    return DEVICE_BACKENDS[device_type]()


def registered_backends() -> list[KernelBackend]:
    """Every backend the registry can return, under any config."""
    return [CUDA_BACKEND, *CPU_BACKENDS.values()]
