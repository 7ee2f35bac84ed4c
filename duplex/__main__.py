"""``python -m duplex``: the ``duplex`` command, for a child process started by this interpreter."""

import sys

from duplex.cli import main

sys.exit(main())
