"""Does dlopen on this machine hand back a library already loaded for a new launcher file? (kiln/_triton.py,
"Loading Triton's launchers"; ResNet-50 at 05ad837 was given a launcher of another signature once.)

Writer processes keep replacing launcher-like libraries in a fresh Triton cache (as racing compiles of one
signature do: each replace frees the old file's inode), while this process loads new ones on threads, first with
Python's own loader (Triton's), then with kiln's. Each load is checked two ways: the library dlopen returned is
the file asked for (dlinfo), and its `launch` takes the number of arguments of its source. Prints the counts; exit
status 1 when kiln's loader ever ran another library's code.

    python -m benchmarks.gpu_launcher_check [--rounds 30] [--sources 24] [--writers 6]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

from tests.runtime.test_launcher_loads import _launcher_like

WRITER = r"""
import sys, time
from triton.runtime.build import compile_module_from_src
from triton.runtime.cache import get_cache_manager
import hashlib, sysconfig
from triton.runtime.build import platform_key
salt, sources, until = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sys.path.insert(0, sys.argv[4])
from tests.runtime.test_launcher_loads import _launcher_like
name = "__triton_launcher" + sysconfig.get_config_var("EXT_SUFFIX")
while time.time() < until:
    for count in range(1, sources + 1):
        src = _launcher_like(count, salt)
        path = compile_module_from_src(src, "__triton_launcher").__file__
        key = hashlib.sha256((src + platform_key()).encode()).hexdigest()
        with open(path, "rb") as f:
            get_cache_manager(key).put(f.read(), name, binary=True)  # a racing compile's write: a new inode
"""


def stock_load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(loader_name: str, rounds: int, sources: int, writers: int, root: str) -> dict:
    from triton.runtime import build

    from kiln import _triton

    build._load_module_from_path = stock_load if loader_name == "stock" else _triton.load_extension_module
    counts = {"loads": 0, "other library": 0, "wrong arity": 0, "errors": 0}
    lock = threading.Lock()
    for round_ in range(rounds):
        salt = f"{loader_name} {round_} {time.time()}"
        until = time.time() + 1.5
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, salt, str(sources), str(until), root])
                 for _ in range(writers)]
        time.sleep(0.3)

        def load(count: int) -> None:
            try:
                module = build.compile_module_from_src(_launcher_like(count, salt), "__triton_launcher")
                other = os.path.realpath(_triton.loaded_library_path(module.__file__)) != \
                    os.path.realpath(module.__file__)
                try:
                    arity_ok = module.launch(*range(count)) == count
                except TypeError:
                    arity_ok = False
                with lock:
                    counts["loads"] += 1
                    counts["other library"] += other
                    counts["wrong arity"] += not arity_ok
            except Exception as error:
                with lock:
                    counts["errors"] += 1
                print(f"  {loader_name}: {type(error).__name__}: {error}"[:300])

        threads = [threading.Thread(target=load, args=(count,)) for count in range(1, sources + 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for proc in procs:
            proc.wait()
    return counts


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--sources", type=int, default=24)
    parser.add_argument("--writers", type=int, default=6)
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-launcher-check-")
    print(f"kernel {platform.release()}; cache {os.environ['TRITON_CACHE_DIR']} "
          f"(file system: {subprocess.run(['stat', '-f', '-c', '%T', os.environ['TRITON_CACHE_DIR']], capture_output=True, text=True).stdout.strip()})")
    results = {name: run(name, args.rounds, args.sources, args.writers, root) for name in ("stock", "kiln")}
    for name, counts in results.items():
        print(f"{name} loader: " + ", ".join(f"{key} {value}" for key, value in counts.items()))
    return 1 if results["kiln"]["wrong arity"] or results["kiln"]["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
