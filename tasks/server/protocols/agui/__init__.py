"""AG-UI 1.0 (``POST /agui/{agent}``): a front end streams an agent's run as AG-UI events,
a projection of the turn's events (``routes`` the door, ``projection`` the mapping)."""
