#!/usr/bin/env bash
# kiln's test suite, as CI runs it: set up .venv, then every test not marked slow.
#
#   bash scripts/test.sh                      # all of tests/ except -m slow
#   bash scripts/test.sh tests/models -x      # arguments go to pytest (in place of "tests")
#
# Triton kernels run under the Triton interpreter (TRITON_INTERPRET=1): no GPU needed.
# pytest's exit code 5 ("no tests collected") is turned into a failure: a run that
# tested nothing must never look green.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/env.sh || { echo "test.sh: environment setup failed" >&2; exit 1; }

export TRITON_INTERPRET="${TRITON_INTERPRET:-1}"
if [ "$#" -eq 0 ]; then
    set -- tests
fi
.venv/bin/python -m pytest -q -m "not slow" "$@"
status=$?
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: failing on purpose (exit 5 means nothing was tested)" >&2
    exit 1
fi
exit "$status"
