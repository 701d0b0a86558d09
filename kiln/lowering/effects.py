"""Ops with side effects, which AOTAutograd threads through effect tokens.

`with_effects(token, op, *args)` runs `op(*args)` in token order and returns
`(new_token, *op's results)`; the tokens only order the calls. kiln's wrapper runs
externs in graph order, so the rule calls `op` itself as an extern (e.g.
`_linalg_check_errors`, which raises for a singular matrix) and hands the incoming
token on as the outgoing one.
"""
from __future__ import annotations

import torch

from kiln.lowering.registry import lowering


@lowering(torch.ops.higher_order.with_effects)
def with_effects(ctx, node, token, op, *args, **kwargs):
    fake = node.meta["val"]
    returns = len(op._schema.returns)
    op_fake = None if returns == 0 else fake[1] if returns == 1 else tuple(fake[1:])
    result = ctx.extern(op, args, kwargs, op_fake)
    return (token, *result) if returns > 1 else (token, result)
