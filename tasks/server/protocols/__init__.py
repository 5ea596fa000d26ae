"""The ecosystem's protocols, each a package of its own (``langgraph/`` at ``/lg``, ``agui/``,
...), mounted on the app ``create_app()`` builds with the keys and scoping of ``/v1``.

Each is a projection of the event log and of the calls the client already has, never a
second engine: a run, task or tool call is a turn (or a workflow) that any other door sees
alike, and a caller that comes back reads the log from where it left off.
"""
