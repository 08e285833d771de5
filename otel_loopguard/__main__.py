"""Run the command line: python -m otel_loopguard ..."""

import sys

from .cli import main

sys.exit(main())
