"""The registered agents, one module each, found by name (``recurrent.interface.load_register``): ``memory``
(MemAgent), ``direct`` (the whole document in one call: the paper's long-context baseline), ``calculator`` (a
tool-using arithmetic agent written as a plain async function). A new agent is one module here exporting
``REGISTER``; nothing else names it. A module whose name starts with an underscore is an agent's helper, not an
agent (``_memory_cost``: the memory agent's step cost model)."""
