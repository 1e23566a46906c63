"""``python -m taskutils.endpoint``: see :mod:`taskutils.endpoint.cli`."""

import sys

from taskutils.endpoint.cli import main

sys.exit(main())
