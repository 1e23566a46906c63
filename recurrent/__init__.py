"""The framework: what an agent is (an async function over a chat client, ``interface``, ``functions``), its two
drivers (``generation_manager``: sync mode, lockstep rounds; ``async_manager``: one coroutine per sample), the chat
client, token templating, the official ``openai`` client's route, traces, offline models and local servers.

Nothing here imports verl or names an agent: the agents live in ``recurrent.impls`` (the memory agent is
``recurrent/impls/memory.py``), the verl glue in ``verl_ext``, MemAgent's task tools in ``taskutils``
(docs/architecture.md).
"""
