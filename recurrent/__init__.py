"""The multi-conversation workflow framework and the MemAgent memory agent.

One definition of the agent serves training, evaluation and the quickstart.
"""
