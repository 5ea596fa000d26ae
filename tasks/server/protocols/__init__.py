"""The ecosystem's protocols, each a projection over the client and the event log (never a
second engine), mounted on ``agentstate serve``: ``langgraph`` (the Agent Server protocol
at ``/lg``)."""
