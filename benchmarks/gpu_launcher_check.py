"""Do threads loading Triton launchers at once get each other's `launch` on this machine's Python? (kiln/_triton.py,
"Loading Triton's launchers"; ResNet-50 at 05ad837 was given a launcher of another signature once.)

Threads load launcher-like modules (tests/runtime/test_launcher_loads.py) again and again from Triton's cache and
launch each at once, first through Python's own loader (Triton's), then through kiln's. CPU only: any machine.
Exit status 1 when kiln's loader ever gave a wrong launcher.

    python -m benchmarks.gpu_launcher_check [--threads 6] [--loads 300]
"""
from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import threading
import os

from tests.runtime.test_launcher_loads import launcher_like, pythons_loader


def wrong_launchers(loader, threads: int, loads: int, salt: str) -> int:
    from triton.runtime import build

    build._load_module_from_path = loader
    sources = {count: launcher_like(count, salt) for count in range(1, threads + 1)}
    for source in sources.values():
        build.compile_module_from_src(source, "__triton_launcher")
    wrong = []

    def work(count: int) -> None:
        for _ in range(loads):
            launch = build.compile_module_from_src(sources[count], "__triton_launcher").launch
            try:
                if launch(*range(count)) != count:
                    wrong.append(count)
            except TypeError:
                wrong.append(count)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        workers = [threading.Thread(target=work, args=(count,)) for count in sources]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(interval)
    return len(wrong)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--loads", type=int, default=300)
    args = parser.parse_args()
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-launcher-check-")
    from kiln import _triton

    total = args.threads * args.loads
    print(f"Python {platform.python_version()}, kernel {platform.release()}: {args.threads} threads, {total} loads")
    stock = wrong_launchers(pythons_loader, args.threads, args.loads, "stock")
    kiln = wrong_launchers(_triton.load_extension_module, args.threads, args.loads, "kiln")
    print(f"wrong launchers: Python's loader {stock} of {total}, kiln's {kiln} of {total}")
    return 1 if kiln else 0


if __name__ == "__main__":
    sys.exit(main())
