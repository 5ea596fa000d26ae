"""The one place that reads the environment (prefix ``AGENTSTATE_``)."""

from __future__ import annotations

import os
import re
from enum import StrEnum
from functools import lru_cache

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class HopPolicy(StrEnum):
    """How a turn moves from one phase to the next."""

    EVERY_PHASE = "every_phase"
    INLINE = "inline"


class Settings(BaseSettings):
    """Every knob of agentstate; see the README's configuration table."""

    model_config = SettingsConfigDict(env_prefix="AGENTSTATE_", frozen=True, extra="ignore")

    # URLs may carry passwords: kept out of repr() so that logging Settings leaks none.
    redis_url: str = Field("redis://localhost:6379/0", repr=False)
    broker_url: str = Field("", repr=False)
    database_url: str = Field("sqlite:///agentstate.db", repr=False)
    lock_timeout: float = Field(30.0, gt=0)
    session_ttl: float = Field(3600.0, gt=0)
    cache_ttl: int = Field(3600, gt=0)
    execution_timeout: float = Field(30.0, gt=0)
    retry_backoff: float = Field(1.0, ge=0)
    agent: str = "tasks.agent"
    action_modules: str = ""
    max_message_bytes: int = Field(65536, gt=0)
    # What one message may make the reference agent do and store.
    max_calculations_per_message: int = Field(20, ge=1)
    max_reply_bytes: int = Field(16384, ge=64)
    max_facts: int = Field(100, ge=1)
    max_fact_bytes: int = Field(2048, ge=1)
    # What one input may cost anyone; past a limit the input is refused, naming it.
    max_user_state_bytes: int = Field(1 << 20, gt=0)
    max_spec_bytes: int = Field(1 << 20, gt=0)
    max_spec_links: int = Field(100_000, ge=0)
    max_step_io_bytes: int = Field(1 << 20, gt=0)
    # Seconds a handler other than executing's may run before its turn is ended.
    phase_time_limit: float = Field(10.0, gt=0)
    stuck_after: float = Field(60.0, gt=0)
    hop_policy: HopPolicy = HopPolicy.EVERY_PHASE
    # Not in the public surface, but handy for operators and benchmarks.
    task_events: bool = True
    sweep_interval: float = Field(15.0, gt=0)
    max_recoveries: int = Field(3, ge=1)
    auto_migrate: bool = True
    queue: str = "agentstate"
    baseline_tasks: bool = False

    @field_validator("agent", "queue")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()

    @model_validator(mode="after")
    def _broker_defaults_to_redis(self) -> Settings:
        if not self.broker_url:
            object.__setattr__(self, "broker_url", self.redis_url)
        return self

    @property
    def action_module_list(self) -> list[str]:
        """The modules named by ``AGENTSTATE_ACTION_MODULES``, in order."""
        return [name.strip() for name in self.action_modules.split(",") if name.strip()]

    @property
    def visibility_timeout_s(self) -> int:
        """Broker redelivery delay: well above the longest task we run."""
        longest = max(self.execution_timeout, self.lock_timeout, self.stuck_after)
        return int(max(3600.0, longest * 4))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide Settings (``get_settings.cache_clear()`` to re-read)."""
    return Settings()


# Up to the last "@" before the host: passwords may themselves contain "@".
_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<cred>[^/\s]*)@")


def redact_url(text: str) -> str:
    """Hide the user:password part of every URL in ``text`` (for logs and errors)."""
    return _CREDENTIALS.sub(lambda m: f"{m.group('scheme')}***@", text)


def child_environment(settings: Settings) -> dict[str, str]:
    """This process's environment, with AGENTSTATE_* replaced by ``settings`` exactly (for
    the worker processes the demo, tests and benchmarks start)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSTATE_")}
    for name, value in settings.model_dump().items():
        env[f"AGENTSTATE_{name.upper()}"] = str(getattr(value, "value", value))
    return env
