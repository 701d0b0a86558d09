"""kiln/aot/plain.py `trace_to_aten`: a plain inference graph traced to ATen once, without AOTAutograd.

The trace must hand kiln's backend the ATen graph AOTAutograd would have: the same ops, node for node
(compared as a multiset of targets, on Hugging Face models in their default configs, with and without
autocast: Llama's rotary embedding turns autocast off inside the graph), the same results, and AOTAutograd
not run at all. Graphs that are not plain, or whose trace writes in place to memory another name sees, still go through
AOTAutograd; writes to values of the graph's own (ResNet's ReLU(inplace=True)) are made functional.
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


class _BasicBlock(torch.nn.Module):
    """torchvision's ResNet block as it is written: ReLU(inplace=True) and `out += identity`."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.relu = torch.nn.ReLU(inplace=True)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class _ResNetLike(torch.nn.Module):
    def __init__(self, channels: int = 8):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, channels, 3, 1, 1, bias=False),
                                        torch.nn.BatchNorm2d(channels), torch.nn.ReLU(inplace=True))
        self.blocks = torch.nn.Sequential(_BasicBlock(channels), _BasicBlock(channels))
        self.fc = torch.nn.Linear(channels, 10)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return (self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1)),)


def _with_metas(module: torch.fx.GraphModule, *inputs) -> torch.fx.GraphModule:
    """`module` with each node's trace-time value in meta["val"], as a frontend's or make_fx's trace leaves it."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(module, FakeTensorMode()).propagate(*inputs)
    return module


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
@pytest.mark.parametrize("build", [_bert, _gpt2, _llama, _ResNetLike], ids=["bert", "gpt2", "llama", "resnet-block"])
def test_the_single_trace_gives_aotautograds_graph(build, autocast, monkeypatch):
    """The ResNet's in-place writes (to values of its own) are made functional, as AOTAutograd's
    functionalization makes them."""
    torch.manual_seed(0)
    model = build().eval()
    tokens = torch.randn(2, 3, 8, 8) if build is _ResNetLike else torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        output = model(tokens)
        expected = output[0] if isinstance(output, tuple) else output.to_tuple()[0]
    traced, traced_graphs, traced_aot = _compile_and_record(model, tokens, autocast, True, monkeypatch)
    aot, aot_graphs, aot_aot = _compile_and_record(model, tokens, autocast, False, monkeypatch)
    assert traced_aot == 0 and aot_aot == 1  # the single trace replaced AOTAutograd; off, AOTAutograd ran
    assert len(traced_graphs) == len(aot_graphs) == 1
    assert traced_graphs == aot_graphs  # the same ATen ops, as many of each
    torch.testing.assert_close(traced, aot, rtol=0, atol=0)
    tolerance = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(traced.float(), expected.float(), **tolerance)


def _view_write(x):
    t = x * 2
    t.view(-1)[0] = 0.0  # written through a view: the write is not private to `t`'s name
    return t + 1


def _input_write(x):
    y = x.relu_()  # the caller's tensor is written: AOTAutograd's wrapper copies the write back
    return y * 2


def _aliased_write(x):
    t = x * 2
    v = t.view(-1)  # a view taken before the write must see it
    t.add_(1)
    return v * 3


def _later_use(x):
    t = x * 2
    t.relu_()  # written in place, then read by its old name
    return t + 1, t * 3


def _layout_write(x):
    t = x + 1
    t.t_()  # an in-place view op: the value's layout is written
    return t * 2, t.sum(0)


@pytest.mark.parametrize("program", [_later_use, _layout_write], ids=["data", "layout"])
def test_a_private_write_read_by_its_old_name_later_reads_the_new_value(program):
    x = torch.randn(4, 5)
    before = _aot_runs()
    with torch.no_grad():
        out = kiln.compile(program)(x)
    assert _aot_runs() == before  # traced once: the write made functional
    for got, expected in zip(out, program(x.clone())):
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected)


def _input_layout_write(x):
    x.t_()  # the caller's tensor is restrided: its fake, as the frontend's trace left it, shows it already
    return x.sum(0)


def _promoting_write(x):
    t = x.to(torch.bfloat16) * 2
    t += x  # float32 into bf16: the write keeps bf16, an out-of-place add would give float32
    return t


@pytest.mark.parametrize("program", [_view_write, _input_write, _input_layout_write, _aliased_write, _promoting_write],
                         ids=["through-a-view", "an-input", "an-inputs-layout", "of-a-value-with-a-view",
                              "of-another-dtype"])
def test_writes_the_single_trace_cannot_make_functional_go_through_aotautograd(program):
    x = torch.randn(4, 5)
    expected_input = x.clone()
    expected = program(expected_input)
    before = _aot_runs()
    with torch.no_grad():
        out = kiln.compile(program)(x)
    assert _aot_runs() - before == 1
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, expected_input)  # the input as eager leaves it


def test_a_decompositions_write_to_a_fresh_value_is_made_functional(monkeypatch):
    """A decomposition that writes its result into a fresh tensor (copy_ into empty_like) leaves an in-place op in
    the ATen trace; AOTAutograd, which applies decompositions below its functionalization, refuses such a graph
    (an assertion). The single trace makes the write functional (`aten.copy`), so the backend gets a functional
    graph and the result is eager's."""
    from kiln.aot import decompositions

    def silu_via_copy(x):
        out = torch.empty_like(x)
        out.copy_(x * torch.sigmoid(x))
        return out  # the written tensor by its own name: later uses must read the write

    table = dict(decompositions.decomposition_table())
    table[torch.ops.aten.silu.default] = silu_via_copy
    monkeypatch.setattr("kiln.aot.decomposition_table", lambda: table)
    handed = []

    def recording(gm, example_inputs, **options):
        handed.append([str(node.target) for node in gm.graph.nodes if node.op == "call_function"])
        return COMPILE_ATEN(gm, example_inputs, **options)

    monkeypatch.setattr(backend, "compile_aten_graph", recording)

    def program(x):
        return torch.nn.functional.silu(x) + 1

    x = torch.randn(16)
    before = _aot_runs()
    with torch.no_grad():
        out = kiln.compile(program)(x)
    assert _aot_runs() == before and len(handed) == 1
    assert "aten.copy.default" in handed[0] and not any(target.endswith("_.default") for target in handed[0])
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


def test_functionalize_private_writes_redirects_later_reads_of_the_written_name():
    """make_fx's traces read a written tensor through the in-place call's result, but an FX graph may name the
    written value itself afterwards: those reads must see the write."""
    aten = torch.ops.aten
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    t = graph.call_function(aten.mul.Tensor, (x, 2))
    before = graph.call_function(aten.neg.default, (t,))  # read before the write: keeps the old value
    graph.call_function(aten.relu_.default, (t,))
    after = graph.call_function(aten.add.Tensor, (t, 1))  # read after the write, by the written name
    graph.output((before, after))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    value = torch.randn(6)
    _with_metas(module, value)
    assert plain.functionalize_private_writes(graph) is None
    module.recompile()
    got_before, got_after = module(value)
    torch.testing.assert_close(got_before, -(value * 2))
    torch.testing.assert_close(got_after, torch.relu(value * 2) + 1)
    assert not any(str(node.target).endswith("_.default") for node in graph.nodes)


def test_a_write_to_an_unsafe_views_result_is_not_made_functional():
    """`_unsafe_view`'s schema does not mark its result as an alias, but it shares its argument's memory: a write
    to it is seen through the argument, so the pass refuses it (AOTAutograd then traces the graph)."""
    aten = torch.ops.aten
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    product = graph.call_function(aten.mm.default, (x, x))
    flat = graph.call_function(aten._unsafe_view.default, (product, [16]))
    graph.call_function(aten.relu_.default, (flat,))
    graph.output((graph.call_function(aten.add.Tensor, (product, 1)),))  # reads the write through `product`
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    _with_metas(module, torch.randn(4, 4))
    assert plain.functionalize_private_writes(graph) == "aten.relu_.default"


class _RotaryLike(torch.nn.Module):
    """A forward that calls a `torch.no_grad()` function, as Hugging Face's rotary embeddings (some releases) do."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    @torch.no_grad()
    def _angles(self, x):
        return torch.cos(x.float()) * 2

    def forward(self, x):
        return self.linear(x) + self._angles(x)


def test_a_no_grad_function_inside_an_inference_call_is_traced_once(monkeypatch):
    """Under no_grad, the function's `torch.no_grad()` changes nothing: the frontend records no grad-mode node, and
    the graph takes the single trace (AOTAutograd does not run)."""
    torch.manual_seed(0)
    model, x = _RotaryLike().eval(), torch.randn(4, 8)
    graphs, compile_graph = [], backend._compile_graph

    def recording(gm, *args):
        graphs.append(gm)
        return compile_graph(gm, *args)

    monkeypatch.setattr(backend, "_compile_graph", recording)
    kiln.reset()
    before = _aot_runs()
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model)(x), model(x))
    assert _aot_runs() == before and len(graphs) == 1
    assert not any(node.target is torch._C._set_grad_enabled for node in graphs[0].graph.nodes)


def _grad_mode_graph(*modes: bool) -> torch.fx.GraphModule:
    """x -> sin(x), with `_set_grad_enabled(mode)` calls before it, in order."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    for mode in modes:
        graph.call_function(torch._C._set_grad_enabled, (mode,))
    graph.output((graph.call_function(torch.sin, (x,)),))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    for node in module.graph.nodes:
        if node.op == "placeholder":
            node.meta["example_value"] = torch.empty(3)
        elif node.target is torch.sin:
            node.meta["example_value"] = torch.empty(3)
    return module


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_grad_mode_changes_keep_a_graph_plain_when_they_leave_the_mode_as_found(grad):
    """A graph that switches grad mode and switches it back is plain (autograd plays no part when no input requires
    grad); one that leaves the mode changed is not, nor one that turns grad on around an input that requires it."""
    x = torch.randn(3)
    with torch.set_grad_enabled(grad):
        assert plain.not_plain_reason(_grad_mode_graph(not grad, grad), [x]) is None
        assert plain.not_plain_reason(_grad_mode_graph(not grad), [x]) == "the graph leaves grad mode changed"
        if not grad:
            reason = plain.not_plain_reason(_grad_mode_graph(True, False), [x.requires_grad_()])
            assert reason is not None and "require grad" in reason
