"""``python -m tasks.cli``: the same as the ``agentstate`` command."""

import sys

from tasks.cli.main import main

sys.exit(main())
