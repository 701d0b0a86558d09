"""The process-wide compile lock.

kiln compiles one thing at a time per process: tracing a frame (kiln/frontend), AOTAutograd
(kiln/aot: torch's FX tracing patches module-level state, `CURRENT_PATCHER`, which two threads
tracing at once corrupt) and everything after it. A thread that finds no cache entry takes the
lock, then looks again: another thread may have compiled that entry while it waited, and it is
reused instead of traced twice. Re-entrant, since a compile may start another (AOTAutograd calls
kiln's backend for each graph it makes). Compiled code runs outside it: calls stay parallel.
"""
from __future__ import annotations

import threading

compile_lock = threading.RLock()
