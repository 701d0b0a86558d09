"""What transformers' default-config forward does around its tensors, traced as one graph:

- a model config's Python __getattribute__ (heterogeneous per-layer views): values read for real and
  guarded, methods bound as usual, a missing attribute an AttributeError the code can catch;
- classes with an ABCMeta metaclass created inside the function (the cache's layers);
- a plain object created inside returned to the caller (the DynamicCache), rebuilt without its
  __init__, one object wherever the trace put it.

Before, each of these made GPT-2's and Llama's whole forward run eagerly in their default config.
"""
from __future__ import annotations

import abc

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")


class _Layer(abc.ABC):
    @abc.abstractmethod
    def update(self, x): ...


class _DoublingLayer(_Layer):
    def __init__(self):
        self.seen = None

    def update(self, x):
        self.seen = x * 2
        return self.seen


class _Cache:
    def __init__(self, count):
        self.layers = [_DoublingLayer() for _ in range(count)]


def _through_cache(x):
    cache = _Cache(2)
    y = x
    for layer in cache.layers:
        y = layer.update(y) + 1
    return y, cache, cache.layers[0]


def test_abc_objects_made_and_returned_are_rebuilt_with_their_state_and_identity():
    compiled = kiln.compile(_through_cache, fullgraph=True)
    x = torch.randn(3)
    y, cache, first = compiled(x)
    want_y, want_cache, _ = _through_cache(x)
    assert torch.equal(y, want_y)
    assert type(cache) is _Cache and [type(layer) for layer in cache.layers] == [_DoublingLayer] * 2
    assert first is cache.layers[0]  # one object wherever the trace put it
    for got, want in zip(cache.layers, want_cache.layers):
        assert torch.equal(got.seen, want.seen)


class _Abstract(abc.ABC):
    @abc.abstractmethod
    def run(self): ...


def test_an_abstract_class_still_cannot_be_created():
    def make(x):
        return _Abstract(), x

    with kiln.config.patch(strict=True), pytest.raises(Exception, match="abstract"):
        kiln.compile(make, fullgraph=True)(torch.ones(1))


def _uses_config(x, config):
    scale = config.n_embd if hasattr(config, "n_embd") else 1
    missing = getattr(config, "no_such_attribute_here", 7)
    text = config.get_text_config()
    return x * scale + missing + text.n_layer


def test_config_reads_are_values_guarded_and_methods_are_bound():
    config = transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2)
    compiled = kiln.compile(_uses_config, fullgraph=True)
    x = torch.randn(4)
    assert torch.equal(compiled(x, config), _uses_config(x, config))
    assert torch.equal(compiled(x, config), _uses_config(x, config))
    assert len(compiled.entries) == 1  # a bound method read per call is not a changed value
    config.n_embd = 16  # a changed value is seen
    assert torch.equal(compiled(x, config), _uses_config(x, config))
    assert len(compiled.entries) == 2


def test_default_gpt2_forward_is_one_graph_with_its_dynamic_cache():
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 50, (2, 8))
    compiled = kiln.compile(model, fullgraph=True)
    with torch.no_grad():
        got, want = compiled(input_ids=ids), model(input_ids=ids)
    assert type(got.past_key_values) is type(want.past_key_values)
    assert kiln.testing.compare(got, want)
