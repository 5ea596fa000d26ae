"""Configuration: one typed Settings read from ``AGENTSTATE_*`` variables."""

from config.settings import (
    HopPolicy,
    Settings,
    child_environment,
    get_settings,
    redact_url,
    settings_error_line,
)

__all__ = [
    "HopPolicy",
    "Settings",
    "child_environment",
    "get_settings",
    "redact_url",
    "settings_error_line",
]
