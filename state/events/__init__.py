"""Events and time travel: each session's event log, its revisions, the push that wakes
followers, and retention."""
