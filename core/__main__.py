"""``python -m torchkiln``."""

import sys

from torchkiln.cli import main

sys.exit(main())
