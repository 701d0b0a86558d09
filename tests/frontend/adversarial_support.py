"""What the adversarial test files share: `plain`, a comparable form of a result or a state; a program's outcome
(its result or the exception it raised); and `check_calls`, which runs a program eagerly and compiled on twin
states and compares both after every call."""
from __future__ import annotations

import torch

import kiln


def plain(value, other=lambda value: value):
    """A comparable form of `value`: tensors as (dtype, shape, requires_grad, values), lists, tuples and dicts item
    by item, anything else through `other` (called with `plain` for its parts' forms)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.requires_grad, value.detach().tolist())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [plain(item, other) for item in value])
    if isinstance(value, dict):
        return (type(value).__name__, [(key, plain(item, other)) for key, item in value.items()])
    return other(value)


def outcome(fn, args, plain):
    """("returned", plain(result)) or ("raised", exception type name, message): the program's own exception
    must be eager's too."""
    try:
        return ("returned", plain(fn(*args)))
    except Exception as error:
        return ("raised", type(error).__name__, str(error))


def check_calls(make, calls, plain, strict=True):
    """make() -> (fn, state); each call(state) -> the arguments, after changing the state as it likes. The
    outcome and the state (both through `plain`) must be eager's after every call. Not `strict`: for the
    programs that must break the graph (strict mode refuses a break)."""
    eager_fn, eager_state = make()
    compiled_fn, compiled_state = make()
    compiled = kiln.compile(compiled_fn)
    with kiln.config.patch(strict=strict):
        for number, call in enumerate(calls):
            expected = outcome(eager_fn, call(eager_state), plain)
            actual = outcome(compiled, call(compiled_state), plain)
            assert actual == expected, f"call {number}"
            assert plain(compiled_state) == plain(eager_state), f"state after call {number}"
