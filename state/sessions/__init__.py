"""Layer 1 storage: session rows, their history and their inbox."""
