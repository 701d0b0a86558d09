"""kiln/schedule/fusion.py: which nodes share a kernel."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import kiln
import kiln.testing
from kiln.backend import compile_graph


def _conv_net(x, *parameters):
    """Four conv + batch norm + relu layers of 16 channels (a conv net's body), with each batch norm's statistics."""
    for layer in range(4):
        weight, mean, var, gamma, beta = parameters[5 * layer:5 * layer + 5]
        x = F.relu(F.batch_norm(F.conv2d(x, weight, padding=1), mean, var, gamma, beta, training=False))
    return (x,)


def test_the_batch_norms_per_channel_values_of_a_conv_net_share_one_kernel(kernel_sources):
    """Each inference batch norm's 1 / sqrt(var + eps) is a node over its channels that reads only parameters
    (kiln/schedule/inline.py keeps it out of the activation's kernel). Far apart in the program, they still
    share one kernel: one launch where there were four."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 6, 6, generator=generator)
    parameters = []
    for _ in range(4):
        parameters += [torch.randn(16, 16, 3, 3, generator=generator) * 0.1, torch.randn(16, generator=generator),
                       torch.rand(16, generator=generator) + 0.5, torch.randn(16, generator=generator),
                       torch.randn(16, generator=generator)]
    with kiln.config.patch(cpu_backend="triton", strict=True):
        compiled = compile_graph(torch.fx.symbolic_trace(_conv_net), [x, *parameters])
        result = compiled(x, *parameters)
    verdict = kiln.testing.compare(list(result), list(_conv_net(x, *parameters)),
                                   list(_conv_net(*(t.double() for t in (x, *parameters)))))
    assert verdict, verdict.message
    (channels,) = [source for source in kernel_sources if "tl.sqrt_rn(" in source]
    assert channels.count("tl.sqrt_rn(") == 4
    assert len(kernel_sources) == 5  # the per-channel values, then each layer's batch norm and relu
