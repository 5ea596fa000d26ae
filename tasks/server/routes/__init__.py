"""One router per resource: sessions, workflows, approvals, users, health."""
