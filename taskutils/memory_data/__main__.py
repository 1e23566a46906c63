"""``python -m taskutils.memory_data``: the data stages' command line, :mod:`taskutils.memory_data.run`."""

from taskutils.memory_data.run import main

raise SystemExit(main())
