"""A2A 1.0 (JSON-RPC at ``/a2a/{agent}``, public agent cards): other agents call ours.
contextId = session, task = turn, ``input-required`` = a pending approval; a projection of
the event log (``handler``), never a task store of its own."""
