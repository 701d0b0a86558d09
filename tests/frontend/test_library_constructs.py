"""Library constructs real models execute in their forwards: custom torch.autograd.Functions (BLOOM's GeLU),
and libraries' lru_cache'd helpers (transformers' `is_torch_available`, which reaches importlib.metadata)."""
from __future__ import annotations

import functools

import pytest
import torch

import kiln


class ScaledTanh(torch.autograd.Function):
    """A forward that keeps values on ctx, and a backward that is deliberately not tanh's derivative, so a
    test can tell whether the custom backward ran."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        ctx.save_for_backward(x)
        return torch.tanh(x) * scale

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 7.0, None


class SetupContextGelu(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return 0.5 * x * (1 + torch.erf(x / 2 ** 0.5))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        return grad * 3.0


def program(x):
    return ScaledTanh.apply(x + 1, 2.5).sum(-1) + SetupContextGelu.apply(x).mean(-1)


def test_an_autograd_function_is_traced_inline_where_no_gradient_flows():
    x = torch.randn(4, 6)
    with torch.no_grad():
        report = kiln.explain(program, x)
        assert report.graph_count == 1 and not report.breaks and not report.eager_frames
        torch.testing.assert_close(kiln.compile(program, fullgraph=True)(x), program(x))
    # grad mode on, but nothing requires grad: still inline
    assert kiln.explain(program, x).graph_count == 1
    torch.testing.assert_close(kiln.compile(program)(x), program(x))


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_an_autograd_function_with_a_gradient_keeps_its_own_backward(cpu_backend):
    """Where a gradient can flow, Fn.apply is one node of the graph: AOTAutograd traces its own backward, which is
    the one used (7, not tanh's derivative), in one graph with kernels."""
    def scaled(x):
        return ScaledTanh.apply(x * 1.0, 2.0).sum() * 3

    x = torch.randn(5, requires_grad=True)
    with kiln.config.patch(cpu_backend=cpu_backend, strict=True):
        report = kiln.explain(scaled, x)
        assert report.graph_count == 1 and not report.breaks and not report.eager_frames
        x.grad = None
        result = kiln.compile(scaled)(x)
        result.backward()
    torch.testing.assert_close(result, scaled(x.detach()))
    torch.testing.assert_close(x.grad, torch.full((5,), 21.0))  # the custom backward, not tanh's derivative


@functools.lru_cache
def _program_helper(flag: bool) -> int:  # the program's own cached helper: traced, as before
    return 3 if flag else 4


def test_a_librarys_cached_helper_is_called_not_traced():
    pytest.importorskip("transformers")
    from transformers.utils import import_utils

    def uses_helpers(x):
        if import_utils.is_torch_available() and import_utils.is_torch_distributed_available():
            x = x * 2
        return x + _program_helper(True)

    x = torch.randn(3)
    report = kiln.explain(uses_helpers, x)
    assert report.graph_count == 1 and not report.breaks and not report.eager_frames
    torch.testing.assert_close(kiln.compile(uses_helpers)(x), uses_helpers(x))


def test_bloom_and_wav2vec2_are_captured_whole():
    """BLOOM's GeLU is a custom autograd.Function; Wav2Vec2's encoder asks is_fsdp_managed_module, which reaches
    importlib.metadata through transformers' cached is_torch_available (the frame ran eagerly)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    bloom = transformers.BloomForCausalLM(transformers.BloomConfig(hidden_size=32, n_head=4, n_layer=2,
                                                                   vocab_size=64)).eval()
    wav2vec2 = transformers.Wav2Vec2Model(transformers.Wav2Vec2Config(
        hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, conv_dim=(8, 8),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2)).eval()
    cases = [(bloom, {"input_ids": torch.randint(0, 64, (2, 8))}, "logits"),
             (wav2vec2, {"input_values": torch.randn(2, 400)}, "last_hidden_state")]
    with torch.no_grad():
        for model, inputs, field in cases:
            report = kiln.explain(model, **inputs)
            assert report.graph_count == 1 and not report.breaks and not report.eager_frames, type(model).__name__
            torch.testing.assert_close(getattr(kiln.compile(model)(**inputs), field), getattr(model(**inputs), field),
                                       atol=1e-4, rtol=1e-4)
