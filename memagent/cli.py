"""Argument types shared by the command lines (``quickstart.py``, ``python -m memagent.memory_data``,
``python -m memagent.memory_eval.run``, the server): defined in :mod:`recurrent.options`, named here for the
commands of this package."""

from recurrent.options import non_negative_int, positive_int, positive_seconds, seconds

__all__ = ["non_negative_int", "positive_int", "positive_seconds", "seconds"]
