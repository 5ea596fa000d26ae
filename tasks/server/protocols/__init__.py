"""The ecosystem's protocols, each a package of its own, mounted on ``agentstate serve``
with the keys and scoping of ``/v1``: ``langgraph`` (the Agent Server protocol at
``/lg``), ``agui`` (``POST /agui/{agent}``), ``a2a`` (``/a2a/{agent}`` and the agent
cards), ``mcp`` (``/mcp``).

Each is a projection of the event log and of the calls the client already has, never a
second engine: a run, task or tool call is a turn (or a workflow) that any other door sees
alike, and a caller that comes back reads the log from where it left off.
"""
