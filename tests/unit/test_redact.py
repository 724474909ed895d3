"""No secret in any message or log line: URL passwords and password=... are masked."""

from __future__ import annotations

import io
import logging

import pytest

from slurm_burst.cli.common import RedactFilter
from slurm_burst.core.redact import has_inline_password, redact


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql+psycopg://burst:s3cret@db:5432/l", "postgresql+psycopg://burst:***@db:5432/l"),
        ("url 'mysql+pymysql://u:p@[::1/db' is bad", "url 'mysql+pymysql://u:***@[::1/db' is bad"),
        ("dsn host=db password=s3cret user=x", "dsn host=db password=*** user=x"),
        ("token: abc123, next", "token: ***, next"),
        ("sqlite:////var/lib/x.db", "sqlite:////var/lib/x.db"),
        ("postgresql://root@127.0.0.1/db", "postgresql://root@127.0.0.1/db"),
    ],
    ids=["pg-url", "quoted-bad-url", "libpq-dsn", "token", "sqlite", "no-password"],
)  # fmt: skip
def test_redact(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_inline_password_is_recognised() -> None:
    assert has_inline_password("postgresql://u:pw@h/d")
    assert not has_inline_password("postgresql://u@h/d")
    assert not has_inline_password("postgresql://u:@h/d")


def test_log_records_and_their_tracebacks_are_redacted() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactFilter())
    log = logging.getLogger("test.redact")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("connecting to %s", "postgresql://burst:s3cret@db/ledger")
        try:
            raise RuntimeError("could not connect to postgresql://burst:s3cret@db/ledger")
        except RuntimeError:
            log.exception("ledger.failed")
    finally:
        log.removeHandler(handler)
    text = out.getvalue()
    assert "s3cret" not in text
    assert text.count("burst:***@db") == 3  # the message, the traceback's source line, the error
    assert "RuntimeError" in text  # the traceback is kept, masked
