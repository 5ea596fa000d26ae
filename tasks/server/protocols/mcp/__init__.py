"""MCP (Streamable HTTP at ``/mcp``): assistants reach the deployment's agents and actions
as tools (``tools`` the tools, ``door`` the transport behind the service's keys)."""
