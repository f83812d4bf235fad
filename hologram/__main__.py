"""``python -m hologram``: the ``hologram`` command (:mod:`hologram.cli`)."""

import sys

from hologram.cli import main

sys.exit(main())
