"""Variable trackers: what the symbolic interpreter knows about each Python value.

`builder.wrap(tx, value, source)` turns a real value into a tracker and installs its
guard; the kinds live by concept in base (protocol, constants), tensor, containers,
functions, objects, modules, builtins and torch_special.
"""
