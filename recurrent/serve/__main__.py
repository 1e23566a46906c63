"""``python -m recurrent.serve``: see :mod:`recurrent.serve.cli`."""

import sys

from recurrent.serve.cli import main

sys.exit(main())
