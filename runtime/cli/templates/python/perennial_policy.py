"""Helpers for Perennial policies written in Python (vendored by `perennial plugin new`).

- `Config`: reads the job's JSON config; every error names the field and what is wrong.
- `Stats`, `Decision` (trigger), `Batch`, `TRAIN`/`EVAL`/`SKIP` (splitter), `Model`, `Choice`
  (selector): plain Python types, so that a policy's logic is tested with `python -m unittest`
  with no WebAssembly involved.
- `log`: lines attributed to the job on the host; Python's `logging` when run natively.

`app.py` (the component's entry) converts between these and the WIT types.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

TRAIN, EVAL, SKIP = 0, 1, 2
"""A sample's assignment, as the splitter returns it: one of these per sample."""


class ConfigError(ValueError):
    """A config the policy refuses; the host refuses the policy with this message."""


_MISSING = object()


class Config:
    """A policy's JSON config (`"{}"` when the job gives none), read field by field.

    Call `finish()` after reading every field: an unknown field (a typo) is an error.
    """

    def __init__(self, text: str):
        try:
            values = json.loads(text or "{}")
        except json.JSONDecodeError as err:
            raise ConfigError(f"config: not JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"config: expected a JSON object, got {type(values).__name__}")
        self._values = values
        self._read: set[str] = set()

    def _get(self, name: str, default):
        self._read.add(name)
        value = self._values.get(name, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise ConfigError(f"{name}: missing")
            return default
        return value

    def integer(self, name: str, default=_MISSING, minimum: Optional[int] = None, maximum: Optional[int] = None) -> int:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: expected an integer, got {json.dumps(value)}")
        _check_range(name, value, minimum, maximum)
        return value

    def number(self, name: str, default=_MISSING, minimum: Optional[float] = None, maximum: Optional[float] = None) -> float:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}: expected a number, got {json.dumps(value)}")
        _check_range(name, value, minimum, maximum)
        return float(value)

    def string(self, name: str, default=_MISSING, choices: Optional[list[str]] = None) -> str:
        value = self._get(name, default)
        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected a string, got {json.dumps(value)}")
        if choices is not None and value not in choices:
            raise ConfigError(f"{name}: {json.dumps(value)} is not one of {', '.join(choices)}")
        return value

    def boolean(self, name: str, default=_MISSING) -> bool:
        value = self._get(name, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true or false, got {json.dumps(value)}")
        return value

    def finish(self) -> None:
        unknown = sorted(set(self._values) - self._read)
        if unknown:
            known = ", ".join(sorted(self._read)) or "none"
            raise ConfigError(f"{unknown[0]}: unknown field (this policy reads: {known})")


def _check_range(name, value, minimum, maximum):
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}: {value} is below the minimum {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name}: {value} is above the maximum {maximum}")


@dataclass
class Stats:
    """What a trigger sees (the WIT record `trigger.stats`)."""

    pending_train: int = 0
    pending_eval: int = 0
    total_samples: int = 0
    rounds_completed: int = 0
    seconds_since_last_round: Optional[int] = None
    wall_clock_secs: int = 0
    utc_offset_secs: int = 0
    deployed_metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Decision:
    """A trigger's answer; `reason` is shown on the job."""

    train: bool
    reason: str
    recheck_after_secs: Optional[int] = None

    @staticmethod
    def train_now(reason: str) -> "Decision":
        return Decision(True, reason)

    @staticmethod
    def wait(reason: str, recheck_after_secs: Optional[int] = None) -> "Decision":
        return Decision(False, reason, recheck_after_secs)


class Batch:
    """New samples for a splitter. Their lines are fetched from the host on first use."""

    def __init__(self, first_seq: int, count: int, fetch: Callable[[], list[str]]):
        self.first_seq = first_seq
        self.count = count
        self._fetch = fetch
        self._lines: Optional[list[str]] = None

    @staticmethod
    def of_lines(first_seq: int, lines: list[str]) -> "Batch":
        """A batch for tests."""
        return Batch(first_seq, len(lines), lambda: list(lines))

    def __len__(self) -> int:
        return self.count

    def seq(self, index: int) -> int:
        """The job's sequence number of sample `index` of the batch."""
        return self.first_seq + index

    def lines(self) -> list[str]:
        if self._lines is None:
            self._lines = self._fetch()
            if len(self._lines) != self.count:
                raise RuntimeError(f"the host sent {len(self._lines)} lines for a batch of {self.count}")
        return self._lines


def unpack_lines(data: bytes, ends: list[int]) -> list[str]:
    """The host's packed lines (`batch-data.lines`): one string per sample."""
    lines, start = [], 0
    for end in ends:
        lines.append(bytes(data[start:end]).decode("utf-8"))
        start = end
    return lines


@dataclass
class Model:
    """A trained model a selector chooses among."""

    url: str
    format: str = ""
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Choice:
    """A selector's answer: the index of the candidate to deploy, or None to keep the deployed one."""

    deploy: Optional[int]
    reason: str

    @staticmethod
    def deploy_model(index: int, reason: str) -> "Choice":
        return Choice(index, reason)

    @staticmethod
    def keep(reason: str) -> "Choice":
        return Choice(None, reason)


class _Log:
    """Log lines: to the host (attributed to the job) inside the component, else to `logging`."""

    def __init__(self):
        self._host: Optional[Callable[[str, str], None]] = None
        self._native = logging.getLogger("policy")

    def use_host(self, write: Callable[[str, str], None]) -> None:
        self._host = write

    def _write(self, level: str, message: str) -> None:
        if self._host is not None:
            self._host(level, message)
        else:
            self._native.log(getattr(logging, level.upper(), logging.INFO), message)

    def debug(self, message: str) -> None:
        self._write("debug", message)

    def info(self, message: str) -> None:
        self._write("info", message)

    def warning(self, message: str) -> None:
        self._write("warn", message)

    def error(self, message: str) -> None:
        self._write("error", message)


log = _Log()
