"""The Azure provider's connection to ARM: libcloud's, paced per request and pointed at
an endpoint of the site's choosing (:func:`arm_connection`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from slurm_burst.adapters.cloud.providers import split_endpoint

log = logging.getLogger(__name__)

KIND = MappingProxyType({"GET": "reads", "HEAD": "reads", "DELETE": "deletes"})  # else writes
REMAINING = "x-ms-ratelimit-remaining-subscription-{}"


def arm_connection(base: Any, url: str, ca_file: str = "") -> Any:
    """The driver's connection class, changed in two ways:

    - every request takes its turn from the budget of its kind first (``meter_of()``,
      the cloud's meter: reads, writes, deletes), gives the meter what the answer says is
      left, and on a 429 lets the meter cut the rate and repeat it after ``Retry-After``;
    - with ``url`` (``https://HOST[:PORT]``, or plain http on loopback), ARM requests and
      the token exchange go there (libcloud takes only a host for either, and logs in on
      port 443);
    - with ``ca_file``, both trust that CA bundle (a private endpoint's: Azure Stack Hub,
      the lab) instead of the system's.
    """
    target = split_endpoint(url) if url else None

    class Connection(base):  # type: ignore[misc]
        meter_of: Callable[[], Any] | None = None

        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            if target is not None:
                self.secure, self.host, self.port = target
                self.login_host = self.host

        def get_token_from_credentials(self) -> None:
            if target is None:
                super().get_token_from_credentials()
                return
            from urllib.parse import urlencode

            from libcloud.common.azure_arm import AzureAuthJsonResponse

            conn = self.conn_class(self.host, self.port, secure=self.secure, timeout=self.timeout)
            if ca_file:  # (libcloud's connection takes its CA as an attribute only)
                conn.ca_cert = ca_file
            conn.connect()
            form = urlencode(
                {
                    "grant_type": "client_credentials",
                    "client_id": self.user_id,
                    "client_secret": self.key,
                    "resource": self.login_resource,
                }
            )
            conn.request(
                "POST",
                f"/{self.tenant_id}/oauth2/token",
                form,
                {"Content-type": "application/x-www-form-urlencoded"},
            )
            js = AzureAuthJsonResponse(conn.getresponse(), conn)  # type: ignore[no-untyped-call]
            got: dict[str, Any] = js.object or {}
            self.access_token = got["access_token"]
            self.expires_on = got["expires_on"]

        def connect(self, **kw: Any) -> Any:
            out = super().connect(**kw)
            if ca_file and self.connection is not None:
                self.connection.ca_cert = ca_file
            return out

        def request(
            self,
            action: str,
            params: Any = None,
            data: Any = None,
            headers: Any = None,
            method: str = "GET",
            raw: bool = False,
        ) -> Any:
            from libcloud.common.exceptions import BaseHTTPError

            kind = KIND.get(method, "writes")
            meter = self.meter_of() if self.meter_of is not None else None
            while True:
                if meter is not None:
                    meter.before(kind)
                try:
                    resp = super().request(
                        action, params=params, data=data, headers=headers, method=method, raw=raw
                    )
                except BaseHTTPError as exc:
                    if exc.code == 429 and meter is not None:
                        exc.metered = True  # type: ignore[attr-defined]
                        if meter.throttled(kind, float(getattr(exc, "retry_after", 0) or 0)):
                            continue
                    raise
                left = (getattr(resp, "headers", None) or {}).get(REMAINING.format(kind))
                if meter is not None and left is not None:
                    try:
                        meter.after(kind, float(left))
                    except ValueError:
                        log.warning("azure.bad_header %s=%r", REMAINING.format(kind), left[:40])
                return resp

    return Connection
