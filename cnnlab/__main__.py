"""`python -m cnnlab`: the command line."""

import sys

from cnnlab.cli import main

sys.exit(main())
