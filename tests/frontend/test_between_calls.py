"""What users change on a compiled model between calls, each checked against the same change made to an eager twin:
train/eval mode (dropout), freezing and unfreezing parameters, a replaced submodule, load_state_dict, a new
Parameter object, forward hooks added and removed, an AdamW loop with gradient clipping and a scheduler, no_grad
then grad, model.double(), plain attributes read in forward, a global tensor rebound or written in place, and
varying batch sizes. A missed guard here is a silent wrong answer."""
from __future__ import annotations

import contextlib
import copy

import torch
import torch.nn as nn

import kiln
import kiln.testing


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.ReLU(), nn.Linear(8, 2))


X = torch.randn(5, 4)


def _twins(mode: str = "eval"):
    eager = _model()
    compiled_module = copy.deepcopy(eager)
    getattr(eager, mode)()
    getattr(compiled_module, mode)()
    return eager, compiled_module, kiln.compile(compiled_module)


def test_train_and_eval_switches():
    eager, module, compiled = _twins()
    torch.testing.assert_close(compiled(X), eager(X))
    for mode in ("train", "eval", "train"):
        getattr(eager, mode)()
        getattr(module, mode)()
        torch.manual_seed(1)
        actual = compiled(X)
        torch.manual_seed(1)
        with kiln.testing.philox_draws():  # eager draws kiln's dropout masks
            torch.testing.assert_close(actual, eager(X))


def test_freezing_and_unfreezing_a_parameter():
    _, module, compiled = _twins()
    compiled(X).sum().backward()
    first = module[0].weight.grad.clone()
    module.zero_grad(set_to_none=True)
    module[0].weight.requires_grad_(False)
    compiled(X).sum().backward()
    assert module[0].weight.grad is None and module[3].weight.grad is not None
    module[0].weight.requires_grad_(True)
    module.zero_grad(set_to_none=True)
    compiled(X).sum().backward()
    torch.testing.assert_close(module[0].weight.grad, first)


def test_structure_and_weights_changed():
    eager, module, compiled = _twins()
    compiled(X)
    for target in (eager, module):
        torch.manual_seed(2)
        target[3] = nn.Linear(8, 3)
    torch.testing.assert_close(compiled(X), eager(X))
    other = copy.deepcopy(eager)
    for parameter in other.parameters():
        parameter.data.normal_()
    for target in (eager, module):
        target.load_state_dict(other.state_dict())
    torch.testing.assert_close(compiled(X), eager(X))
    weight = torch.randn(8, 4)
    for target in (eager, module):
        target[0].weight = nn.Parameter(weight.clone())
    torch.testing.assert_close(compiled(X), eager(X))


def test_hooks_added_and_removed():
    eager, module, compiled = _twins()
    compiled(X)
    handles = [target[3].register_forward_hook(lambda mod, args, out: out * 10) for target in (eager, module)]
    torch.testing.assert_close(compiled(X), eager(X))
    for handle in handles:
        handle.remove()
    torch.testing.assert_close(compiled(X), eager(X))


def test_adamw_with_clipping_and_a_scheduler():
    eager, module, compiled = _twins("train")
    runs = []
    for target, run in ((eager, eager), (module, compiled)):
        optimizer = torch.optim.AdamW(target.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5)
        runs.append((target, run, optimizer, scheduler))
    for step in range(4):
        for target, run, optimizer, scheduler in runs:
            optimizer.zero_grad()
            torch.manual_seed(step)
            with kiln.testing.philox_draws() if run is eager else contextlib.nullcontext():  # kiln's masks
                run(X).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(target.parameters(), 0.5)
            optimizer.step()
            scheduler.step()
    for want, got in zip(eager.parameters(), module.parameters()):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_grad_modes_dtype_and_batch_sizes():
    eager, module, compiled = _twins()
    with torch.no_grad():
        without = compiled(X)
    with_grad = compiled(X)
    assert not without.requires_grad and with_grad.requires_grad
    torch.testing.assert_close(without, with_grad)
    for batch in (2, 3, 7, 9):
        x = torch.randn(batch, 4)
        torch.testing.assert_close(compiled(x), eager(x))
    eager.double()
    module.double()
    result = compiled(X.double())
    assert result.dtype == torch.float64
    torch.testing.assert_close(result, eager(X.double()))


class _Flagged(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 2.0
        self.use_relu = True
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x) * self.scale
        return y.relu() if self.use_relu else y


def test_plain_attributes_read_in_forward():
    module = _Flagged()
    compiled = kiln.compile(module)
    compiled(X)
    module.scale = 3.0
    torch.testing.assert_close(compiled(X), module(X))
    module.use_relu = False
    torch.testing.assert_close(compiled(X), module(X))


_GLOBAL = torch.ones(4)


def _scaled_by_global(x):
    return x * _GLOBAL


def test_a_global_tensor_rebound_or_written():
    global _GLOBAL
    compiled = kiln.compile(_scaled_by_global)
    compiled(X)
    _GLOBAL = torch.full((4,), 3.0)
    torch.testing.assert_close(compiled(X), X * 3)
    _GLOBAL.mul_(2)
    torch.testing.assert_close(compiled(X), X * 6)
    _GLOBAL = torch.ones(4)
