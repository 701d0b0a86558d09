"""Real models captured whole by kiln's frontend: transformers BERT, GPT-2, Llama and a ResNet-like net.

Tiny configs built from config classes with random weights (no downloads). Each
model must be captured as exactly one graph, match eager through the `aot_eager`
rung, and reuse its entry on a second call with new token values.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from kiln.backend import graph_compiler
from kiln.frontend import compile_function

transformers = pytest.importorskip("transformers")


def tiny_bert():
    config = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64)
    return transformers.BertModel(config), {}


def tiny_gpt2():
    config = transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config), {}


def tiny_llama():
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config), {}


class BasicBlock(nn.Module):
    def __init__(self, channels: int, stride: int = 1):
        super().__init__()
        out = channels * stride
        self.conv1 = nn.Conv2d(channels, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.shortcut = nn.Sequential()
        if stride != 1:
            self.shortcut = nn.Sequential(nn.Conv2d(channels, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class TinyResNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(16), BasicBlock(16, 2), BasicBlock(32, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


def _outputs(value):
    """The tensors of a model output, in order (ModelOutput, tuple or tensor)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "to_tuple"):
        value = value.to_tuple()
    return [item for item in value if isinstance(item, torch.Tensor)]


def _check_model(model: nn.Module, make_input, call_kwargs, training: bool = False):
    model.train(training)
    graphs = []
    rung = graph_compiler("aot_eager")

    def backend(gm, example_inputs):
        graphs.append(gm)
        return rung(gm, example_inputs)

    compiled = compile_function(model, backend, fullgraph=True)
    for attempt in range(2):
        inputs = make_input()
        torch.manual_seed(attempt)
        expected = model(inputs, **call_kwargs)
        torch.manual_seed(attempt)
        actual = compiled(inputs, **call_kwargs)
        assert type(actual) is type(expected)
        for got, want in zip(_outputs(actual), _outputs(expected), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert len(graphs) == 1 and len(compiled.entries) == 1
    return compiled


@pytest.mark.parametrize("factory", [tiny_bert, tiny_gpt2, tiny_llama], ids=["bert", "gpt2", "llama"])
def test_transformers_model_is_one_graph(factory):
    torch.manual_seed(0)
    model, kwargs = factory()
    _check_model(model, lambda: torch.randint(0, 100, (2, 8)), kwargs)


def test_transformers_training_mode_backward():
    # The `eager` rung: the frontend's graph must give eager's gradients. (Through `aot_eager`, Llama's
    # gradients differ from eager's with TorchDynamo as the frontend too: a kiln/aot issue, reported.)
    torch.manual_seed(0)
    model, kwargs = tiny_llama()
    model.train()
    compiled = compile_function(model, graph_compiler("eager"), fullgraph=True)
    ids = torch.randint(0, 100, (2, 8))
    loss = compiled(ids, labels=ids, **kwargs).loss
    loss.backward()
    grads = [param.grad.clone() for param in model.parameters()]
    model.zero_grad()
    model(ids, labels=ids, **kwargs).loss.backward()
    for got, param in zip(grads, model.parameters()):
        torch.testing.assert_close(got, param.grad, rtol=1e-4, atol=1e-5)


def test_resnet_like_conv_net_is_one_graph():
    torch.manual_seed(0)
    _check_model(TinyResNet(), lambda: torch.randn(2, 3, 16, 16), {})
