"""``python -m autocdc`` (and ``spark-submit <this file>``): see :mod:`autocdc.pipelines.cli`."""

from __future__ import annotations

import sys

from autocdc.pipelines.cli import main

if __name__ == "__main__":
    sys.exit(main())
