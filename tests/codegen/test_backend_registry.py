"""The kernel backend registry (kiln/codegen/backends.py): one backend per device type, each a
KernelBackend (kiln/codegen/common.py) that generates, names its scheduling needs, and loads."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.codegen.backends import backend_for, registered_backends
from kiln.codegen.common import KernelBackend
from kiln.codegen.cpp import CppBackend, CppKernelSource
from kiln.codegen.triton import KernelSource, TritonBackend
from kiln.lowering import lower_graph
from kiln.schedule import schedule_graph


def _sin_plus_one(x):
    return (torch.ops.aten.add.Tensor(torch.ops.aten.sin.default(x), 1.0),)


@pytest.fixture(scope="module")
def scheduled():
    x = torch.randn(8, 4)
    return schedule_graph(lower_graph(make_fx(_sin_plus_one)(x), [x]))


def test_cuda_is_triton_whatever_the_cpu_backend():
    for cpu_backend in ("cpp", "triton"):
        with kiln.config.patch(cpu_backend=cpu_backend):
            assert backend_for("cuda") == TritonBackend("cuda")


@pytest.mark.parametrize("cpu_backend, expected", [("cpp", CppBackend()), ("triton", TritonBackend("cpu"))])
def test_cpu_follows_config_cpu_backend(cpu_backend, expected):
    with kiln.config.patch(cpu_backend=cpu_backend):
        backend = backend_for("cpu")
    assert backend == expected and backend.device_type == "cpu"


def test_an_unknown_device_names_the_registered_ones():
    with pytest.raises(ValueError, match="device type 'mps'.*registered device types: cpu, cuda"):
        backend_for("mps")


def test_an_unknown_cpu_backend_names_the_choices():
    with kiln.config.patch(cpu_backend="fortran"):
        with pytest.raises(ValueError, match="'fortran'.*choose one of cpp, triton"):
            backend_for("cpu")


@pytest.mark.parametrize("backend", registered_backends(), ids=repr)
def test_every_backend_satisfies_the_protocol(backend, scheduled):
    assert isinstance(backend, KernelBackend)
    assert isinstance(backend.loop_dependent_ops(), frozenset)
    assert backend.load_kernels([]) == {}
    (kernel,) = scheduled.kernels
    source = backend.generate_kernel(kernel, scheduled.graph)
    assert isinstance(source, CppKernelSource if backend.name == "cpp" else KernelSource)
    assert source.name == kernel.name and not source.skip
    assert source.file_suffix == (".cpp" if backend.name == "cpp" else ".py") and source.listing
    arguments = [f"buffer{index}" for index, _ in enumerate(source.buffer_args)]
    arguments += [str(size) for size in source.size_args]
    call = backend.kernel_call(source, arguments, str)
    assert call.startswith(f"{kernel.name}(") and all(argument in call for argument in arguments)
