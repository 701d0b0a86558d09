"""Variable trackers: what the symbolic interpreter knows about each Python value.

`builder.wrap(tx, value, source)` turns a real value into a tracker and installs its
guard, through the makers kinds.py registers; the kinds live by concept in base
(tracker and tracer protocols, constants), tensor, containers, functions, objects,
modules, builtins and torch_special.
"""
