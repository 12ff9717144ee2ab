"""``python -m autocdc``: see :mod:`autocdc.cli`."""

from __future__ import annotations

import sys

from autocdc.cli import main

sys.exit(main())
