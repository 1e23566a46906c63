"""``python -m memagent.serve``: see :mod:`memagent.serve.cli`."""

import sys

from memagent.serve.cli import main

sys.exit(main())
