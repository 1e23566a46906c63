"""Workflow implementations: the memory agent (``memory``). A second, example workflow (a calculator tool
agent) lives in ``examples/calculator_workflow.py``."""
