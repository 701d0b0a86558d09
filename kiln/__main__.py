"""`python -m kiln ...`: the `kiln` command (kiln/cli)."""
import sys

from kiln.cli import main

sys.exit(main())
