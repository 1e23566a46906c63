"""The tool-using arithmetic agent (``recurrent/agents/calculator.py``) trained on CPU: its toy task (``task``)."""
