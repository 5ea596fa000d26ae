"""Human approval: a turn or a workflow step waits for a person's decision.

``requests`` checks what a handler asks for; ``rows`` reads and writes the ``approvals``
table inside a caller's transaction (the decision is one guarded update: the first wins);
``desk`` decides, and expires, approvals end to end: the decision and what it changes in
the turn or the step commit together.
"""
