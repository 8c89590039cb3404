"""`python -m realsim_core` is `realsim`."""

import sys

from realsim_core.cli import main

sys.exit(main())
