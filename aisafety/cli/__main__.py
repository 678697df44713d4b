"""``python -m aisafety.cli``: the command line."""

import sys

from aisafety.cli import main

sys.exit(main())
