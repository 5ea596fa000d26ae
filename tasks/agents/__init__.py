"""The agents of a deployment: the default one and those AGENTSTATE_AGENTS names, of any
kind (phase handlers, LangGraph graphs, Pydantic AI agents), in ``tasks.agents.registry``."""
