"""Adapters that run other frameworks' agents as agentstate agents, one module per
framework, each imported only when an agent of its kind is configured (and installed with
its extra): ``langgraph`` (``pip install 'agentstate-celery[langgraph]'``), ``pydantic_ai``
(``[pydantic-ai]``), and ``openai_agents`` (``[openai-agents]``: the OpenAI Agents SDK's
``Session`` on an agentstate session, used by an app rather than by the workers)."""
