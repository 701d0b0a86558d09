"""The OpInfo sweep: torch's op database run through kiln's backend and compared with eager.

See docs/design/testing_ops.md. CPU tensors run kiln's Triton kernels under the Triton
interpreter, which must be switched on before triton is first imported.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
