"""Workflow implementations: the memory agent (``memory``) and a tool-using calculator agent (``calculator``)."""
