"""Adapters for agent frameworks; each is imported only where it is used, behind its extra."""
