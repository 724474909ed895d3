"""Google Cloud Storage as a staging store, at the HTTP boundary (no emulator of Cloud
Storage's XML API runs here): libcloud's Google Storage driver with a service account's
HMAC key, so these tests assert the exact requests it sends to storage.googleapis.com
(intercepted by ``responses``), and the grants' shape: V4 signed URLs (AWS4-HMAC-SHA256,
which Cloud Storage takes from an HMAC key, region ``auto``), checked against the
algorithm as Google documents it.

Why this grant: libcloud's Google Storage driver has no signed-URL call, and a node must
never hold the site's keys. A V4 signed URL is made locally from the HMAC key, allows
one method on one object, and lasts at most 7 days; it is the nearest Cloud Storage
offers to S3's presigned URL (docs/staging.md)."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import pytest

from slurm_burst.adapters.storage.gcs import GcsStore
from slurm_burst.config.load import load_config
from slurm_burst.config.model import StoreConfig
from slurm_burst.config.validate_staging import staging_problems
from slurm_burst.wiring.storage import object_store
from tests.conftest import LAB_CONFIG

responses = pytest.importorskip("responses", reason="needs responses (make test installs it)")

HMAC_ID, HMAC_SECRET = "GOOGTS7C7FUP3AIRVJTE2BCD", "bGoa+V7g/yqDXvKRqq+JTFn4uQZbPiQJo4pf9RzJ"
API = "https://storage.googleapis.com"


@pytest.fixture
def gcs(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> GcsStore:
    monkeypatch.setenv("GS_ACCESS_KEY_ID", HMAC_ID)
    monkeypatch.setenv("GS_SECRET_ACCESS_KEY", HMAC_SECRET)
    gcs = StoreConfig(name="gcs", bucket="site-stage", driver="google_storage", prefix="sb/")
    cfg = dataclasses.replace(load_config(LAB_CONFIG), stores={"gcs": gcs})
    assert not [p for p in staging_problems(cfg) if p.path.startswith("stores.gcs")]
    store = object_store(cfg, "gcs")
    assert isinstance(store, GcsStore)
    return store


@pytest.fixture
def sent() -> Iterator[Any]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def test_a_google_store_is_the_xml_api_with_the_hmac_key(gcs: GcsStore) -> None:
    assert (gcs.host, gcs.port, gcs.secure, gcs.region) == ("storage.googleapis.com", 443,
                                                             True, "auto")  # fmt: skip


def test_each_call_is_one_signed_request_to_the_object(gcs: GcsStore, sent: Any) -> None:
    key = "sb/acct-physics/o/ab/" + "ab" * 32
    url = f"{API}/site-stage/{key}"
    sent.add("HEAD", url, status=404)
    sent.add("PUT", url, status=200, headers={"ETag": '"5d41402abc4b2a76b9719d911017c592"'})
    sent.add("GET", url, body=b"hello", status=200)
    sent.add("DELETE", url, status=204)
    assert gcs.has(key) is False
    assert gcs.write_bytes(key, b"hello") == 5  # its ETag, the MD5 of what was stored
    assert gcs.read(key, 100) == b"hello"
    gcs.delete(key)
    calls = [(c.request.method, c.request.url) for c in sent.calls]
    assert calls == [("HEAD", url), ("PUT", url), ("GET", url), ("DELETE", url)]
    for c in sent.calls:
        auth = c.request.headers["Authorization"]
        assert re.fullmatch(rf"GOOG1 {HMAC_ID}:[A-Za-z0-9+/]{{27}}=", auth), auth
        assert HMAC_SECRET not in str(c.request.headers)
    assert sent.calls[1].request.headers["Content-Length"] == "5"


def test_a_grant_is_a_v4_signed_url_for_one_method_on_one_object(gcs: GcsStore) -> None:
    key = "sb/acct-physics/o/cd/" + "cd" * 32
    for method in ("GET", "PUT"):
        url = gcs.grant(key, 900, method)
        parts = urlsplit(url)
        assert (parts.scheme, parts.netloc, parts.path) == ("https", "storage.googleapis.com",
                                                            f"/site-stage/{key}")  # fmt: skip
        q = dict(parse_qsl(parts.query))
        assert q["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256" and q["X-Amz-Expires"] == "900"
        assert q["X-Amz-SignedHeaders"] == "host"
        day = q["X-Amz-Date"][:8]
        assert q["X-Amz-Credential"] == f"{HMAC_ID}/{day}/auto/s3/aws4_request"
        assert q["X-Amz-Signature"] == _google_v4(method, parts.path, q)
        assert HMAC_SECRET not in url


def _google_v4(method: str, path: str, q: dict[str, str]) -> str:
    """The V4 signature as Cloud Storage documents it ("Signing process", HMAC key)."""
    params = {k: v for k, v in q.items() if k != "X-Amz-Signature"}
    query = "&".join(
        f"{quote(k, safe='')}={quote(v, safe='-_.~')}" for k, v in sorted(params.items())
    )
    request = f"{method}\n{path}\n{query}\nhost:storage.googleapis.com\n\nhost\nUNSIGNED-PAYLOAD"
    scope = q["X-Amz-Credential"].split("/", 1)[1]
    to_sign = "\n".join(["AWS4-HMAC-SHA256", q["X-Amz-Date"], scope,
                         hashlib.sha256(request.encode()).hexdigest()])  # fmt: skip
    key = f"AWS4{HMAC_SECRET}".encode()
    for part in scope.split("/"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
