"""GPU check of kiln's gather bounds rule (issue 11): an out-of-range index raises IndexError on
CUDA as on CPU, the graph stays usable after it, and the same holds under CUDA graphs.

Both of config.gpu_index_checks' policies: "sync" raises in the call that gathered; "deferred"
(the default) raises at the graph's next call, and a call makes no host sync (checked with
torch.cuda.set_sync_debug_mode("error"), which raises on any synchronizing CUDA call).

    python -m benchmarks.gpu_index_check        # one PASS/FAIL line per case; exit 1 on a FAIL
"""
from __future__ import annotations

import sys

import torch

import kiln
import kiln.testing

F = torch.nn.functional


def _check(actual, eager) -> None:
    verdict = kiln.testing.compare(actual, eager)
    if not verdict:
        raise AssertionError(verdict.message)


def _case(name: str, mode: str, checks: str, fn, make_good, make_bad) -> bool:
    torch._dynamo.reset()
    kiln.reset()
    label = f"{name} [{mode}, {checks}]"
    try:
        with kiln.config.patch(strict=True, gpu_index_checks=checks):
            compiled = kiln.compile(fn, mode=mode)
            for _ in range(3):  # reduce-overhead: warm-up, record, replay
                args = make_good()
                _check(compiled(*args), fn(*args))
            if checks == "deferred":
                args = make_good()
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
                try:
                    result = compiled(*args)
                finally:
                    torch.cuda.set_sync_debug_mode(0)
                _check(result, fn(*args))
            raised = None
            try:
                compiled(*make_bad())
                torch.cuda.synchronize()
                if checks == "deferred":
                    compiled(*make_good())  # the bad call's flag is read here
            except IndexError as error:
                raised = error
            if raised is None:
                print(f"FAIL {label}: an out-of-range index did not raise")
                return False
            for _ in range(2):  # usable again, and the error is not reported twice
                args = make_good()
                _check(compiled(*args), fn(*args))
    except Exception as error:  # noqa: BLE001 - report every case
        print(f"FAIL {label}: {type(error).__name__}: {str(error)[:300]}")
        return False
    print(f"PASS {label}: IndexError: {str(raised)[:120]}")
    return True


def main() -> int:
    device = "cuda"
    weight = torch.randn(10, 64, device=device)
    source = torch.randn(12, 8, device=device)

    def good_rows():
        return weight, torch.randint(0, 10, (4, 7), device=device)

    def bad_rows():
        rows = torch.randint(0, 10, (4, 7), device=device)
        rows[1, 3] = 10
        return weight, rows

    def good_cat():
        return source, torch.randint(0, 23, (5,), device=device)

    def bad_cat():
        return source, torch.tensor([0, 3, 24, 1, 2], device=device)

    results = []
    for mode in ("default", "reduce-overhead"):
        for checks in ("deferred", "sync"):
            results.append(_case("embedding * 2", mode, checks, lambda w, i: F.embedding(i, w) * 2, good_rows,
                                 bad_rows))
            results.append(_case("cat(x, 2x)[i + 1]", mode, checks,
                                 lambda x, i: torch.cat([x, 2 * x], 0)[i + 1] + 1, good_cat, bad_cat))
    print(f"gpu_index_check: {sum(results)} of {len(results)} cases pass")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
