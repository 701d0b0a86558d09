"""kiln's tests; a package so that `python -m tests.ops.sweep` and pytest agree on module names."""
