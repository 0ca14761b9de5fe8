"""``python -m nearline``: the same command line as the ``nearline`` script."""

import sys

from nearline.cli import main

sys.exit(main())
