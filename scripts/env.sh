#!/usr/bin/env bash
# Create or refresh kiln's virtual environment in .venv (idempotent; a second run takes ~2 s).
#
#   bash scripts/env.sh            # then: source .venv/bin/activate
#
# - .venv is made with `python3 -m venv` when missing. Where the system python3 already
#   imports torch (a GPU machine with its own CUDA build), the venv sees the system
#   packages and keeps that torch; elsewhere torch==2.13.0 is installed (on the
#   development machines pip takes the CPU wheel from the local wheel folder).
# - The rest: triton==3.6.0 numpy sympy transformers pytest expecttest matplotlib (`kiln bench`'s plots)
#   accelerate (the integration tests), each installed
#   only when it does not import; lightning where it can be (its test skips otherwise); then kiln
#   itself, editable (`pip install -e . --no-deps`).
# - Debian's chromium, for the compile report's browser test (apt-get, as root; see below).
# Set PYTHON to choose the interpreter that makes the venv (default python3).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
VENV_PYTHON=.venv/bin/python

if [ ! -x "$VENV_PYTHON" ]; then
    if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
        echo "env.sh: creating .venv (keeping the system's torch: --system-site-packages)"
        "$PYTHON" -m venv --system-site-packages .venv
    else
        echo "env.sh: creating .venv"
        "$PYTHON" -m venv .venv
    fi
fi

# The compile report's browser test (tests/debug/test_html_report.py) loads its page in Debian's
# headless Chromium: installed with apt-get when it is missing and this runs as root; otherwise
# that test is skipped, saying why. One `command -v` when it is there.
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "env.sh: installing Debian's chromium (the HTML report's browser test)"
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1; then
            echo "env.sh: could not install chromium; the HTML report's browser test will be skipped"
        fi
    else
        echo "env.sh: no chromium (installing it needs root and apt-get); the HTML report's browser test will be skipped"
    fi
fi

# Fast path: everything imports and kiln is installed from this checkout.
if "$VENV_PYTHON" - <<'PY' >/dev/null 2>&1
import importlib.metadata, importlib.util, os, sys
for name in ("torch", "triton", "numpy", "sympy", "transformers", "pytest", "expecttest", "matplotlib", "accelerate"):
    if importlib.util.find_spec(name) is None:
        sys.exit(1)
importlib.metadata.version("kiln")
import kiln
sys.exit(0 if os.path.realpath(os.path.dirname(kiln.__file__)) == os.path.realpath("kiln") else 1)
PY
then
    exit 0
fi

PIP=("$VENV_PYTHON" -m pip install -q --disable-pip-version-check)

if ! "$VENV_PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "env.sh: installing torch==2.13.0"
    "${PIP[@]}" "torch==2.13.0"
fi

missing=()
for spec in "triton==3.6.0:triton" "numpy:numpy" "sympy:sympy" "transformers:transformers" \
            "pytest:pytest" "expecttest:expecttest" "matplotlib:matplotlib" "accelerate:accelerate"; do
    module="${spec##*:}"
    if ! "$VENV_PYTHON" -c "import $module" >/dev/null 2>&1; then
        missing+=("${spec%%:*}")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "env.sh: installing ${missing[*]}"
    "${PIP[@]}" "${missing[@]}"
fi

# Lightning, for its integration test only (tests/integrations/test_lightning.py): installed with
# the rest on a new venv; where it cannot be installed, that test is skipped, saying why.
if ! "$VENV_PYTHON" -c "import lightning" >/dev/null 2>&1; then
    echo "env.sh: installing lightning (the Lightning integration test)"
    "${PIP[@]}" --retries 1 --timeout 30 lightning \
        || echo "env.sh: could not install lightning; the Lightning integration test will be skipped"
fi

echo "env.sh: installing kiln (editable)"
if "$VENV_PYTHON" -c "import setuptools" >/dev/null 2>&1; then
    "${PIP[@]}" --no-deps --no-build-isolation -e .
else
    "${PIP[@]}" --no-deps -e .
fi
"$VENV_PYTHON" -c "import torch, triton, kiln; print(f'env.sh: ready: torch {torch.__version__}, triton {triton.__version__}, kiln {kiln.__version__}')"
