"""A key's rules, as `tritongate keys create` sets them and the state store keeps them (JSON). The key
itself is never kept: only its SHA-256 digest, which a presented key is looked up by."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from dataclasses import asdict, dataclass, field, replace
from typing import Any

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
DEFAULT_NAME = "default"  # the keys of TRITONGATE_API_KEY / TRITONGATE_API_KEY_FILE: unrestricted
MIN_PRIORITY, MAX_PRIORITY = -100, 100  # vLLM's `priority`: lower is served earlier
KEY_PREFIX = "tg-"


class PolicyError(ValueError):
    """A key's rule that cannot be (a bad name, a negative limit, ...)."""


def digest(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class KeyPolicy:
    name: str
    models: tuple[str, ...] | None = None  # None: every model
    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # tokens (prompt + completion) per minute
    budget: int | None = None  # tokens in all, or per `budget_period_s`
    budget_period_s: int | None = None
    priority: int = 0  # the default priority of its requests
    digest: str = ""
    created: int = 0
    revoked: bool = field(default=False)

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models

    @property
    def limited(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.budget is not None

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, value: bytes) -> KeyPolicy:
        fields: dict[str, Any] = json.loads(value)
        if fields.get("models") is not None:
            fields["models"] = tuple(fields["models"])
        return cls(**fields)

    def revoke(self) -> KeyPolicy:
        return replace(self, revoked=True)


UNRESTRICTED = KeyPolicy(DEFAULT_NAME)


def check_policy(policy: KeyPolicy) -> KeyPolicy:
    """`policy` when every rule can hold; else PolicyError naming the rule."""
    if not NAME.fullmatch(policy.name):
        raise PolicyError(f"name {policy.name!r}: 1 to 64 letters, digits, '.', '_' or '-', starting with a "
                          "letter or digit")
    if policy.name == DEFAULT_NAME:
        raise PolicyError(f"name {DEFAULT_NAME!r} is the keys of TRITONGATE_API_KEY and TRITONGATE_API_KEY_FILE")
    for rule in ("rpm", "tpm", "budget", "budget_period_s"):
        value = getattr(policy, rule)
        if value is not None and value < 1:
            raise PolicyError(f"{rule}: must be at least 1 (got {value})")
    if policy.budget_period_s is not None and policy.budget is None:
        raise PolicyError("budget_period_s: a budget period needs a budget")
    if not MIN_PRIORITY <= policy.priority <= MAX_PRIORITY:
        raise PolicyError(f"priority: must be between {MIN_PRIORITY} and {MAX_PRIORITY} (got {policy.priority})")
    if policy.models is not None and (not policy.models or not all(policy.models)):
        raise PolicyError("models: a list of model ids, none empty")
    return policy


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_period(text: str) -> int:
    """`30d`, `12h`, `90m`, `3600` (seconds) → seconds."""
    match = re.fullmatch(r"(\d+)([smhdw]?)", text.strip())
    if not match or int(match.group(1)) < 1:
        raise PolicyError(f"budget period {text!r}: a whole number with s, m, h, d or w (e.g. 30d)")
    return int(match.group(1)) * _UNITS[match.group(2) or "s"]
