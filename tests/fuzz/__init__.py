"""kiln's differential fuzzer: random programs run eagerly and through kiln, compared.

See docs/design/testing_fuzz.md. `python -m tests.fuzz --help` for the command line.
"""
