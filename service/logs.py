"""The server's logs: one line per event, as text or JSON (``vindex serve --log-json``),
with secrets taken out before any handler writes them.

:class:`Redactor` (a handler filter, so it sees every logger's records) replaces PEM private
keys, values after ``x-api-key`` / ``authorization`` / ``api_key`` and the like, and any word
whose SHA-256 is one of the tenants' API key digests (``add_key_digests``), in the message
and in the traceback. Multi-line text (tracebacks) is kept on one line: JSON escapes it, the
text format writes its newlines as ``\\n``.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import logging
import re
import sys
from typing import Iterable

PRIVATE_KEY_RE = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
                            re.S)
#: A secret named in the text: ``x-api-key: K``, ``authorization: Bearer K``, ``"api_keys": ["K"``...
NAMED_SECRET_RE = re.compile(r"(?i)((?:x-api-key|authorization|api[_-]?keys?|password|secret|token)[\"']?\s*[:=]\s*"
                             r"[\[\(\"']*\s*(?:bearer\s+)?)[^\s\"',\]\)}]+")
WORD_RE = re.compile(r"[!-~]{8,}")  # printable ASCII without spaces, as API keys are (tenants.KEY_RE)
SEPARATORS_RE = re.compile(r"[=:,;]")  # ``key=K``: the key is a part of the word
REDACTED = "[redacted]"
#: Attributes every LogRecord has; the others are event fields given with ``extra=``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class Redactor(logging.Filter):
    """Takes secrets out of every record a handler writes."""

    def __init__(self) -> None:
        super().__init__()
        self._digests: set[bytes] = set()

    def add_key_digests(self, digests: Iterable[bytes]) -> None:
        self._digests.update(digests)

    def redact(self, text: str) -> str:
        text = PRIVATE_KEY_RE.sub("[redacted private key]", text)
        text = NAMED_SECRET_RE.sub(lambda m: m.group(1) + REDACTED, text)
        if self._digests:
            for word in set(WORD_RE.findall(text)):
                for part in {word, *(p.strip("\"'.()[]{}<>") for p in SEPARATORS_RE.split(word))}:
                    if hashlib.sha256(part.encode("utf-8", "surrogateescape")).digest() in self._digests:
                        text = text.replace(part, REDACTED)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self.redact(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        for key, value in list(record.__dict__.items()):
            if key not in _STANDARD and isinstance(value, str):
                setattr(record, key, self.redact(value))
        return True


class OneLineFormatter(logging.Formatter):
    """``time level logger: message`` on one line; a traceback follows with its newlines as ``\\n``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\n", "\\n")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``msg``, the
    fields given with ``extra=``, and ``exc`` (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
               .isoformat(timespec="milliseconds"),
               "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        out.update((k, v) for k, v in record.__dict__.items() if k not in _STANDARD and k not in out)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, default=str)


def configure(level: str, json_lines: bool, stream=None) -> Redactor:
    """Log to ``stream`` (stderr) at ``level``, one line per event; returns the redactor."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else OneLineFormatter())
    redactor = Redactor()
    handler.addFilter(redactor)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    return redactor


def add_key_digests(digests: Iterable[bytes]) -> None:
    """Have every ``Redactor`` on the root logger's handlers take out these API keys too."""
    digests = list(digests)
    for handler in logging.getLogger().handlers:
        for f in handler.filters:
            if isinstance(f, Redactor):
                f.add_key_digests(digests)
