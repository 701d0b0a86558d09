#!/usr/bin/env bash
# Set up .venv, then run kiln's demo: real models compiled with kiln.compile, checked
# against eager, timed, and the generated kernels listed. Arguments go to scripts/demo.py
# (e.g. --backend aot_eager, --models bert,cnn).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/env.sh
exec .venv/bin/python scripts/demo.py "$@"
