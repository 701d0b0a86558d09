"""kiln/aot/plain.py `trace_to_aten`: a plain inference graph traced to ATen once, without AOTAutograd.

The trace must hand kiln's backend the ATen graph AOTAutograd would have: the same ops, node for node
(compared as a multiset of targets, on Hugging Face models in their default configs, with and without
autocast: Llama's rotary embedding turns autocast off inside the graph), the same results, and AOTAutograd
not run at all. Graphs that are not plain, or whose trace writes in place, still go through AOTAutograd.
"""
from __future__ import annotations

import collections

import pytest
import torch

import kiln
from kiln import backend
from kiln.aot import plain

transformers = pytest.importorskip("transformers")

VOCAB = 96
COMPILE_ATEN = backend.compile_aten_graph  # the backend's own, which the tests below wrap


def _bert():
    return transformers.BertModel(transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                          intermediate_size=128, vocab_size=VOCAB,
                                                          max_position_embeddings=64))


def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                                                n_positions=64, bos_token_id=VOCAB - 1,
                                                                eos_token_id=VOCAB - 1))


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64,
                                                                  num_attention_heads=4, num_key_value_heads=2,
                                                                  intermediate_size=96, vocab_size=VOCAB,
                                                                  max_position_embeddings=64))


def _aot_runs() -> int:
    from torch._dynamo.utils import counters

    return counters["aot_autograd"]["total"]


def _compile_and_record(model, tokens, autocast: bool, plain_trace: bool, monkeypatch):
    """The first output of the compiled model, the ATen graphs' op multisets its compile handed the backend, and
    how many times AOTAutograd ran."""
    graphs = []

    def recording(gm, example_inputs, **options):
        graphs.append(collections.Counter(str(node.target) for node in gm.graph.nodes if node.op == "call_function"))
        return COMPILE_ATEN(gm, example_inputs, **options)

    monkeypatch.setattr(backend, "compile_aten_graph", recording)
    before = _aot_runs()
    with kiln.config.patch(plain_trace=plain_trace), torch.no_grad(), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        output = kiln.compile(model)(tokens)
    first = output[0] if isinstance(output, tuple) else output.to_tuple()[0]
    return first, graphs, _aot_runs() - before


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
@pytest.mark.parametrize("build", [_bert, _gpt2, _llama], ids=["bert", "gpt2", "llama"])
def test_the_single_trace_gives_aotautograds_graph(build, autocast, monkeypatch):
    torch.manual_seed(0)
    model = build().eval()
    tokens = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        expected = model(tokens).to_tuple()[0]
    traced, traced_graphs, traced_aot = _compile_and_record(model, tokens, autocast, True, monkeypatch)
    aot, aot_graphs, aot_aot = _compile_and_record(model, tokens, autocast, False, monkeypatch)
    assert traced_aot == 0 and aot_aot == 1  # the single trace replaced AOTAutograd; off, AOTAutograd ran
    assert len(traced_graphs) == len(aot_graphs) == 1
    assert traced_graphs == aot_graphs  # the same ATen ops, as many of each
    torch.testing.assert_close(traced, aot, rtol=0, atol=0)
    tolerance = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(traced.float(), expected.float(), **tolerance)


def test_a_graph_that_writes_in_place_goes_through_aotautograd(monkeypatch):
    """`x.add_(1)` on an input is not plain: AOTAutograd's wrapper must copy the write back to the caller's tensor."""
    def bump(x):
        x.add_(1)
        return x * 2

    x = torch.randn(8)
    expected = (x + 1) * 2
    before = _aot_runs()
    with torch.no_grad():
        out = kiln.compile(bump)(x)
    assert _aot_runs() - before == 1
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, expected / 2)  # the input was written, as eager writes it


def test_a_trace_that_writes_in_place_is_not_handed_to_the_backend(monkeypatch):
    """A plain graph whose ATen trace holds an in-place op (here from a decomposition that writes its result with
    copy_) is refused by the single trace; AOTAutograd, which applies decompositions below its functionalization,
    refuses it too (an assertion), so the graph runs as captured: the backend only ever gets functional graphs."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from kiln.aot import decompositions

    def silu_via_copy(x):
        out = torch.empty_like(x)
        return out.copy_(x * torch.sigmoid(x))

    table = dict(decompositions.decomposition_table())
    table[torch.ops.aten.silu.default] = silu_via_copy
    monkeypatch.setattr("kiln.aot.decomposition_table", lambda: table)

    def program(x):
        return torch.nn.functional.silu(x) + 1

    x = torch.randn(16)
    gm = torch.fx.symbolic_trace(program)
    FakeTensorProp(gm, FakeTensorMode()).propagate(x)  # each node's trace-time value, as a frontend records it
    assert plain.not_plain_reason(gm, [x]) is None
    with torch.no_grad():
        assert plain.trace_to_aten(gm, [x], table) is None
        handed = []
        monkeypatch.setattr(backend, "compile_aten_graph", lambda *args, **kwargs: handed.append(args))
        with kiln.config.patch(strict=False):
            out = kiln.compile(program)(x)
    assert handed == []
    torch.testing.assert_close(out, program(x))


@pytest.mark.parametrize("frontend", ["kiln.compile", "torch.compile"])
def test_dynamos_inputs_take_the_single_trace_and_symbolic_graphs_aotautograd(frontend):
    """Under torch.compile(backend="kiln") the inputs come from Dynamo with its symbolic contexts: the static graph
    of the first call is traced once all the same. A new sequence length compiles a graph of symbolic sizes, which
    takes its sizes as inputs (not plain): AOTAutograd traces that one. Every result matches eager."""
    torch.manual_seed(0)
    model = _llama().eval()
    compiled = kiln.compile(model) if frontend == "kiln.compile" else torch.compile(model, backend="kiln")
    runs = []
    with torch.no_grad():
        for length in (12, 17, 23):
            before = _aot_runs()
            tokens = torch.randint(0, VOCAB, (2, length))
            torch.testing.assert_close(compiled(tokens).logits, model(tokens).logits, rtol=1e-4, atol=1e-4)
            runs.append(_aot_runs() - before)
    assert runs == [0, 1, 0]  # the static graph traced once; the symbolic graph by AOTAutograd, then reused
