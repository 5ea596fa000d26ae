"""Adapters that run other frameworks' agents as agentstate agents, one module per
framework, each imported only when an agent of its kind is configured (and installed with
its extra): ``langgraph`` (``pip install 'agentstate-celery[langgraph]'``), ..."""
