"""The agents that ship with the framework, each registered by name (``pyproject.toml``, group ``recurrent.agents``):
``memory`` (``memory.py``, MemAgent's memory agent, with its step cost in ``memory_cost.py``) and ``direct``
(``direct.py``, the paper's full-context baseline). The framework's core never imports this package."""
