"""`python -m probepo.cli`: the `probepo` command where its script is not on PATH (the tests, a job)."""

import sys

from probepo.cli import main

sys.exit(main())
