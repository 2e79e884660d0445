"""`python -m fedistill`: the command line, where the `fedistill` script is not on PATH."""

import sys

from fedistill.cli import main

sys.exit(main())
