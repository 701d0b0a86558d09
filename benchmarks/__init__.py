"""kiln's benchmark harness: models x {eager, torch.compile (inductor), kiln} x modes.

Entry point: `python -m benchmarks.run --help`. Each case runs in its own process
(`benchmarks.case`); the parent (`benchmarks.run`) plans the cases, enforces timeouts
and writes the results (`benchmarks.report`). See benchmarks/README.md.
"""
