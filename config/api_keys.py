"""AGENTSTATE_API_KEYS: the bearer keys of ``agentstate serve`` and whom each stands for.

The value is a list of ``key:user_id`` pairs separated by commas (or newlines, in a file
named by AGENTSTATE_API_KEYS_FILE); ``key:*`` is an operator key. Lines starting with ``#``
and blank lines are comments. A key is at least MIN_KEY_LENGTH characters (a short one is
guessed). A key is a secret: no error names one, and every accepted key is scrubbed from
log lines like a password.
"""

from __future__ import annotations

import re

from config.urls import remember_secret_values
from state.errors import ConfigurationError, InvalidIdError
from state.ids import MAX_ID_LENGTH, validate_id

VARIABLE = "AGENTSTATE_API_KEYS"
OPERATOR = "*"
MIN_KEY_LENGTH = 16
_SEPARATORS = re.compile(r"[,\n]")
_KEY = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no space: what a header carries


def parse_api_keys(text: str) -> dict[str, str]:
    """``{key: user_id}`` (``"*"`` for an operator) from the variable's value;
    ConfigurationError, quoting no key, if an entry is malformed or a key repeats."""
    table: dict[str, str] = {}
    # A line starting with '#' is a comment (so a commented-out key is never a live one).
    text = "\n".join(line for line in text.splitlines() if not line.strip().startswith("#"))
    entries = [entry.strip() for entry in _SEPARATORS.split(text)]
    for number, entry in enumerate((e for e in entries if e), start=1):
        key, colon, user = entry.partition(":")
        where = f"{VARIABLE}: entry {number}"
        if not colon or not key or not _KEY.fullmatch(key):
            raise ConfigurationError(
                f"{where} is not key:user_id (a key is printable ASCII without spaces "
                "or ':'; key:* is an operator key)"
            )
        if user != OPERATOR:
            try:
                validate_id(user, "user")
            except InvalidIdError:
                raise ConfigurationError(
                    f"{where}: the user must be '*' or an id of 1-{MAX_ID_LENGTH} letters, "
                    "digits or ._:-"
                ) from None
        if key in table:
            raise ConfigurationError(f"{where}: this key is listed twice")
        table[key] = user
    for number, key in enumerate(table, start=1):
        if len(key) < MIN_KEY_LENGTH:
            raise ConfigurationError(
                f"{VARIABLE}: entry {number}: a key must be at least {MIN_KEY_LENGTH} "
                "characters (a short key is guessed); make one with: openssl rand -base64 24"
            )
    if text.strip() and not table:
        raise ConfigurationError(f"{VARIABLE} lists no key:user_id pair")
    remember_secret_values(set(table))
    return table
