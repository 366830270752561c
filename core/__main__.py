"""``python -m torchkiln``."""

import sys

from torchkiln.cli.commands import main

sys.exit(main())
