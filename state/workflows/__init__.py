"""Layer 2 running: the workflow engine and its stores."""
