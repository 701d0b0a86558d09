"""Channels-last convolutions in inference graphs (kiln/aot/layouts.py, `config.conv_layout`).

The layout is observed where it matters, at run time: a TorchDispatchMode records the strides of every
convolution's input and weight as kiln's compiled graph calls ATen's kernel. The results must match eager
(and keep eager's output strides), on both CPU backends; the pass must leave a graph as traced where a
downstream op depends on the traced layout, and leave training graphs alone.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kiln
import kiln.testing
from kiln.debug.explain import ExplainReport, _recording
from tests.models.test_models import TinyResNet, _set_batchnorm_statistics

CPU_BACKENDS = pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])


class ConvolutionLayouts(TorchDispatchMode):
    """For each aten.convolution call: whether its input and its weight were channels-last."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[bool, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution.default:
            self.calls.append(tuple(t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
                                    for t in args[:2]))
        return func(*args, **(kwargs or {}))


def run_compiled(model, inputs: tuple, *, layout: str, cpu_backend: str = "cpp", grad: bool = False):
    """kiln's result (called twice: the second call is the one observed), the convolutions' layouts, explain."""
    report = ExplainReport()
    with kiln.config.patch(conv_layout=layout, strict=True, cpu_backend=cpu_backend), _recording(report), \
            torch.set_grad_enabled(grad), ConvolutionLayouts() as layouts:  # active at the compile too: one entry
        compiled = kiln.compile(model)
        compiled(*inputs)
        layouts.calls.clear()
        result = compiled(*inputs)
    assert report.graphs and not report.breaks and not report.eager_frames
    assert all(graph.fallback is None for graph in report.graphs), "a graph ran eagerly"
    return result, layouts.calls


def assert_matches_eager(result, expected):
    assert kiln.testing.compare(result, expected)
    for got, want in zip(torch.utils._pytree.tree_leaves(result), torch.utils._pytree.tree_leaves(expected)):
        assert got.stride() == want.stride(), (got.stride(), want.stride())


@CPU_BACKENDS
def test_a_resnet_runs_its_convolutions_channels_last(cpu_backend):
    model = _set_batchnorm_statistics(TinyResNet()).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = model(x)
    result, calls = run_compiled(model, (x,), layout="channels_last", cpu_backend=cpu_backend)
    assert_matches_eager(result, expected)
    assert len(calls) == 6
    # every input and every weight of more than 1x1 is channels-last (a 1x1 weight is both layouts at once)
    assert all(input_is_nhwc for input_is_nhwc, _ in calls), calls
    assert sum(weight_is_nhwc for _, weight_is_nhwc in calls) == 5, calls


def test_traced_layouts_stay_under_keep_and_under_auto_on_the_cpu():
    model = _set_batchnorm_statistics(TinyResNet()).eval()
    x = torch.randn(2, 3, 16, 16)
    for layout in ("keep", "auto"):
        _, calls = run_compiled(model, (x,), layout=layout)
        assert calls and not any(input_is_nhwc or weight_is_nhwc for input_is_nhwc, weight_is_nhwc in calls), layout


class FeatureMaps(torch.nn.Module):
    """Conv features returned as they are, and a patch embedding read by a layer norm (ViT's stem)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.patches = torch.nn.Conv2d(8, 16, 4, stride=4)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        features = F.silu(self.conv(x))
        tokens = self.patches(features).flatten(2).transpose(1, 2)
        return features, self.norm(tokens), tokens.mean(1)


@CPU_BACKENDS
def test_outputs_keep_eager_layouts(cpu_backend):
    model = FeatureMaps().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = model(x)
    result, calls = run_compiled(model, (x,), layout="channels_last", cpu_backend=cpu_backend)
    assert_matches_eager(result, expected)
    assert calls == [(True, True), (True, True)]


def test_autocast_casts_write_channels_last():
    """Under autocast the weights' casts to bfloat16 are the copies that become channels-last."""
    model = FeatureMaps().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x)
        result, calls = run_compiled(model, (x,), layout="channels_last")
    assert kiln.testing.compare(result, expected)
    assert calls == [(True, True), (True, True)]


class ViewOfConvolution(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x).relu()
        return y.view(y.shape[0], -1) @ torch.ones(y[0].numel(), 2)  # a view only the traced layout allows


def test_a_view_of_the_traced_layout_keeps_the_graph_as_traced():
    model = ViewOfConvolution().eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
    result, calls = run_compiled(model, (x,), layout="channels_last")
    assert_matches_eager(result, expected)
    assert calls == [(False, False)]


def test_training_graphs_keep_their_traced_layouts():
    model = _set_batchnorm_statistics(TinyResNet()).train()
    reference = _set_batchnorm_statistics(TinyResNet()).train()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 16, 16)
    expected = reference(x)
    expected.sum().backward()
    report = ExplainReport()
    with kiln.config.patch(conv_layout="channels_last", conv_layout_training=False, strict=True), \
            _recording(report), ConvolutionLayouts() as layouts:
        result = kiln.compile(model)(x)
        result.sum().backward()
    assert kiln.testing.compare(result, expected)
    for parameter, want in zip(model.parameters(), reference.parameters()):
        assert kiln.testing.compare(parameter.grad, want.grad)
    assert layouts.calls and not any(input_is_nhwc for input_is_nhwc, _ in layouts.calls)


def test_a_training_graph_with_a_view_only_its_traced_layout_allows_keeps_it():
    """conv_layout_training (on by default): the NHWC values fail the view, so the graph trains as traced."""
    model = ViewOfConvolution().train()
    reference = ViewOfConvolution().train()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 8, 8)
    expected = reference(x)
    expected.sum().backward()
    with kiln.config.patch(conv_layout="channels_last", strict=True), ConvolutionLayouts() as layouts:
        result = kiln.compile(model)(x)
        result.sum().backward()
    assert kiln.testing.compare(result, expected)
    for parameter, want in zip(model.parameters(), reference.parameters()):
        assert kiln.testing.compare(parameter.grad, want.grad)
    # one NHWC call: the re-derivation of the examples that failed at the view; every call after it (the joint
    # trace, the compiled graphs' runs) takes the traced layout
    (tried,) = [index for index, (input_is_nhwc, _) in enumerate(layouts.calls) if input_is_nhwc]
    assert len(layouts.calls) > tried + 1 and not any(nhwc for nhwc, _ in layouts.calls[tried + 1:])


def test_pointwise_kernels_after_channels_last_convolutions_walk_the_channel_innermost():
    """Batch norm, ReLU and the residual add over NHWC activations: each such kernel's rows [N, C, H, W] are
    walked N, H, W, C (kiln/schedule/loop_order.py), so neighbouring lanes touch neighbouring channels."""
    from tests.golden.capture import record_graphs

    model = _set_batchnorm_statistics(TinyResNet()).eval()
    with record_graphs("triton") as graphs, kiln.config.patch(conv_layout="channels_last"), torch.no_grad():
        kiln.compile(model)(torch.randn(2, 3, 16, 16))
    (graph,) = graphs
    headers = [line for line in graph.files["loopir_after_loop_order.txt"].splitlines() if line.startswith("kernel ")]
    walked = [line for line in headers if "order=[x0, x2, x3, x1]" in line]
    assert len(walked) >= 5, headers


@CPU_BACKENDS
def test_training_convolutions_channels_last_with_conv_layout_training(cpu_backend):
    """config.conv_layout_training: the torch-level graph's convolutions take NHWC operands before the joint
    trace, so forward and backward convolutions run channels-last; loss, gradients and strides are eager's."""
    torch.manual_seed(0)
    model = TinyResNet().train()
    reference = TinyResNet().train()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 16, 16)
    initial = {name: value.clone() for name, value in reference.state_dict().items()}
    expected = reference(x)
    expected.sum().backward()
    report = ExplainReport()
    with kiln.config.patch(conv_layout="channels_last", conv_layout_training=True, strict=True,
                           cpu_backend=cpu_backend), _recording(report), ConvolutionLayouts() as layouts:
        compiled = kiln.compile(model)
        compiled(x)  # compiles (the frontend's and AOTAutograd's traces go through the mode too)
        model.zero_grad(set_to_none=True)
        model.load_state_dict(initial)  # the first call's batch-norm statistics undone
        layouts.calls.clear()
        result = compiled(x)
        result.sum().backward()
    assert report.graphs and not report.breaks and not report.eager_frames
    assert all(graph.fallback is None for graph in report.graphs), "a graph ran eagerly"
    assert_matches_eager(result, expected)
    for name, parameter in model.named_parameters():
        assert kiln.testing.compare(parameter.grad, dict(reference.named_parameters())[name].grad), name
        # the parameter's layout (a size-1 dim's stride is free: AccumulateGrad keeps such a gradient as it is)
        assert [stride for size, stride in zip(parameter.shape, parameter.grad.stride()) if size != 1] == \
            [stride for size, stride in zip(parameter.shape, parameter.stride()) if size != 1], name
    forward = layouts.calls  # the compiled forward's convolutions (the backward's run as convolution_backward)
    assert forward and all(input_is_nhwc for input_is_nhwc, _ in forward), forward


def test_training_convolutions_channels_last_under_autocast():
    """The benchmarks' setting: bf16 autocast around the compiled call (no autocast node in the graph)."""
    torch.manual_seed(0)
    model = TinyResNet().train()
    reference = TinyResNet().train()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 16, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference(x)
    expected.float().sum().backward()
    with kiln.config.patch(conv_layout="channels_last", conv_layout_training=True, strict=True), \
            torch.autocast("cpu", dtype=torch.bfloat16), ConvolutionLayouts() as layouts:
        result = kiln.compile(model)(x)
    result.float().sum().backward()
    assert kiln.testing.compare(result, expected)
    for name, parameter in model.named_parameters():
        # bf16 products summed in another order: about 1% of the gradient's largest entry (0.0137 of 1.41
        # for the stem's weight, the same with the traced layouts)
        want = dict(reference.named_parameters())[name].grad
        torch.testing.assert_close(parameter.grad, want, rtol=0.05, atol=0.02 * float(want.abs().max()), msg=name)
    assert any(input_is_nhwc for input_is_nhwc, _ in layouts.calls), layouts.calls  # the compiled forward's
