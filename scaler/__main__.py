"""`python -m scaler` runs the command line."""

import sys

from scaler.cli import main

sys.exit(main())
