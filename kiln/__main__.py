"""`python -m kiln ...`: the `kiln` command (kiln/cli)."""
import sys

from kiln.cli import main

if __name__ == "__main__":  # importing the module (tests/test_layering.py imports each one) runs nothing
    sys.exit(main())
