"""One spawned worker process and its pipe: what tests/ops/workers.py (the OpInfo sweep) and
tests/fuzz/workers.py (fuzz runs) share. Each pool speaks its own protocol over the pipe and
keeps its own loop; both start, stop, kill and explain the death of a worker the same way, and
send the workers' stdout and stderr to the run's log."""
from __future__ import annotations

import os
import signal
import sys
import time


def redirect_output(log_path: str | None) -> None:
    """In a worker: torch's C++ warnings and faulthandler's crash dumps go to the run's log, not the console."""
    if not log_path:
        return
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


class WorkerProcess:
    """A `target(connection, *args)` process with the parent's end of its pipe and a deadline.

    `ready` turns True when the worker says so; `deadline` is the time past which the parent
    treats it as hung (first the start-up allowance, then whatever the pool sets).
    """

    def __init__(self, context, target, args: tuple, startup_seconds: float) -> None:
        self.connection, child_end = context.Pipe()
        self.process = context.Process(target=target, args=(child_end, *args), daemon=True)
        self.process.start()
        child_end.close()
        self.ready = False
        self.deadline = time.monotonic() + startup_seconds

    def stop(self) -> None:
        """Ask the worker to finish (a None task), killing it if it does not within 10 s."""
        try:
            self.connection.send(None)
        except OSError:
            pass
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)
        self.connection.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(10)
        self.connection.close()

    def death_reason(self) -> str:
        self.process.join(10)
        code = self.process.exitcode
        if code is not None and code < 0:
            return f"worker killed by {signal.Signals(-code).name}"
        return f"worker exited with code {code}"
