"""Secrets out of text: whatever slurm-burst prints or logs passes through :func:`redact`.

A database URL carries its password (``postgresql://user:pw@host/db``), a libpq DSN its
``password=...``; an error message or a traceback that quotes one must not show it.
Pure: text in, text out.
"""

from __future__ import annotations

import re

_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*):(?P<pw>[^\s@'\"]*)@")
_KEYWORD = re.compile(
    r"(?P<head>\b(?:password|passwd|secret|token|api_key|secret_key)\s*[=:]\s*)(?P<v>[^\s,;'\"&]+)",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with URL passwords and ``password=``-style values replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}:***@", text)
    return _KEYWORD.sub(lambda m: f"{m['head']}***", text)


def has_inline_password(url: str) -> bool:
    """Whether a URL carries a password (``scheme://user:PASSWORD@host``)."""
    m = _URL_PASSWORD.search(url)
    return m is not None and bool(m["pw"])
