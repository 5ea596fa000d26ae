"""The ``agentstate`` command. The command line is one more app on top of the client, so
its parser, its command groups, how it reports failures and prints progress, and the
demo it can run sit in their own room; ``main`` is the entry point pyproject names
(``agentstate = "tasks.cli:main"``)."""

from tasks.cli.main import main

__all__ = ["main"]
