"""The tool-using arithmetic agent (``experiments/calculator/agent.py``) trained on CPU: its toy task (``task``)."""
