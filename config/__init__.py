"""Configuration: one typed Settings read from ``AGENTSTATE_*`` variables."""

from config.settings import HopPolicy, Settings, get_settings, redact_url

__all__ = ["HopPolicy", "Settings", "get_settings", "redact_url"]
