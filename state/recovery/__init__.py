"""The recovery sweep: finding and resuming work whose task was lost."""
