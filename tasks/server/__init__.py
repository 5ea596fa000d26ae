"""The HTTP service and console (``agentstate serve``): agentstate from any language and
any browser. A room of its own, apart from the workers: the service is one more app on
top of the client. ``tasks.server.app.create_app`` builds it; ``tasks.server.serve``
runs it under uvicorn. FastAPI and uvicorn come with the ``server`` extra."""
