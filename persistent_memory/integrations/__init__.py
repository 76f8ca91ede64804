"""Adapters for agent frameworks, one module each, behind an extra of its own
(``persistent_memory.integrations.langgraph``: ``pip install ...[langgraph]``)."""
