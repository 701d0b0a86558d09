"""Do threads loading Triton launchers at once get each other's `launch` on this machine's Python? (kiln/_triton.py,
"Loading Triton's launchers"; ResNet-50 at 05ad837 was given a launcher of another signature once.)

Threads load launcher-like modules (tests/runtime/test_launcher_loads.py) again and again from Triton's cache and
launch each at once, first through Python's own loader (Triton's), then through kiln's. CPU only: any machine.
Exit status 1 when kiln's loader ever gave a wrong launcher.

    python -m benchmarks.gpu_launcher_check [--threads 6] [--loads 300]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile

from tests.runtime.test_launcher_loads import pythons_loader, wrong_launchers


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--loads", type=int, default=300)
    args = parser.parse_args()
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-launcher-check-")
    from triton.runtime import build

    from kiln import _triton

    total = args.threads * args.loads
    print(f"Python {platform.python_version()}, kernel {platform.release()}: {args.threads} threads, {total} loads")
    build._load_module_from_path = pythons_loader
    stock = wrong_launchers(args.threads, args.loads, "stock")
    build._load_module_from_path = _triton.load_extension_module
    kiln = wrong_launchers(args.threads, args.loads, "kiln")
    print(f"wrong launchers: Python's loader {stock} of {total}, kiln's {kiln} of {total}")
    return 1 if kiln else 0


if __name__ == "__main__":
    sys.exit(main())
