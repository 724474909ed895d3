"""Presigned URLs: AWS Signature Version 4 carried in the query string.

A node fetches each staged object with a URL that allows one method on one object for
a few minutes, and nothing else: the site's storage keys never leave the controller.
The algorithm is AWS's "Authenticating Requests: Using Query Parameters": a canonical
request (method, path, sorted query, the signed ``host`` header, ``UNSIGNED-PAYLOAD``),
hashed into a string to sign under a scope of date/region/s3, signed with a key derived
from the secret by four HMACs. The ``host`` signed is the one the client will send,
with its port when not the scheme's default (the reason this is not libcloud's
``get_object_cdn_url``, which drops it).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from urllib.parse import quote, urlsplit

MAX_SECONDS = 7 * 86400  # S3's longest presigned URL


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def presign(
    method: str,
    base: str,
    path: str,
    *,
    region: str,
    key: str,
    secret: str,
    seconds: int,
    token: str = "",
    now: float | None = None,
) -> str:
    """``base``: scheme://host[:port]; ``path``: already percent-encoded (/bucket/key)."""
    if not 1 <= seconds <= MAX_SECONDS:
        raise ValueError(f"a grant lasts 1 s to 7 days, not {seconds} s")
    at = time.gmtime(time.time() if now is None else now)
    stamp, day = time.strftime("%Y%m%dT%H%M%SZ", at), time.strftime("%Y%m%d", at)
    scope = f"{day}/{region}/s3/aws4_request"
    query = {
        "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
        "X-Amz-Credential": f"{key}/{scope}",
        "X-Amz-Date": stamp,
        "X-Amz-Expires": str(seconds),
        "X-Amz-SignedHeaders": "host",
    }
    if token:
        query["X-Amz-Security-Token"] = token
    canonical_query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items())
    )
    host = urlsplit(base).netloc
    canonical = "\n".join(
        [method, path, canonical_query, f"host:{host}\n", "host", "UNSIGNED-PAYLOAD"]
    )
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    signing_key = _hmac(
        _hmac(_hmac(_hmac(f"AWS4{secret}".encode(), day), region), "s3"), "aws4_request"
    )
    signature = hmac.new(signing_key, to_sign.encode(), hashlib.sha256).hexdigest()
    return f"{base}{path}?{canonical_query}&X-Amz-Signature={signature}"
