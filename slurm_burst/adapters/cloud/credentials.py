"""Provider credentials: found where the config says, handed to the driver, never shown.

Three sources, in this order of precedence:

1. ``credentials.file``: a TOML file (mode 0600 or stricter; a file others can read
   is refused) with ``key`` and ``secret``, and for some drivers more (below);
2. ``credentials.key_env`` / ``credentials.secret_env``: environment variables named
   in the config;
3. neither: the provider's standard environment (``AWS_ACCESS_KEY_ID``…,
   ``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_CLIENT_ID``…, ``OS_USERNAME``…).

What each driver's constructor gets (libcloud's names):

=========  ======================================  ====================================
driver     key / secret                            also (file keys or environment)
=========  ======================================  ====================================
ec2        access key id / secret access key       ``token`` (AWS_SESSION_TOKEN)
gce        service account e-mail / key file path  (from GOOGLE_APPLICATION_CREDENTIALS)
azure_arm  client (application) id / its secret    ``tenant_id``, ``subscription_id``
openstack  user name / password                    ``ex_force_auth_url``, ``ex_tenant_name``
=========  ======================================  ====================================

Errors name the variable or file that is missing, never a value.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurm_burst import extensions
from slurm_burst.config import Credentials, ProviderConfig
from slurm_burst.config.model import StoreConfig
from slurm_burst.core.errors import BadInput
from slurm_burst.fileio import not_private, untrusted

# the provider's standard environment: driver -> {constructor argument: variable}
STANDARD_ENV: dict[str, dict[str, str]] = {
    "ec2": {"key": "AWS_ACCESS_KEY_ID", "secret": "AWS_SECRET_ACCESS_KEY"},
    "azure_blobs": {"key": "AZURE_STORAGE_ACCOUNT", "secret": "AZURE_STORAGE_KEY"},
    # a service account's HMAC key, as gsutil's boto configuration names them
    "google_storage": {"key": "GS_ACCESS_KEY_ID", "secret": "GS_SECRET_ACCESS_KEY"},
    "azure_arm": {
        "key": "AZURE_CLIENT_ID",
        "secret": "AZURE_CLIENT_SECRET",
        "tenant_id": "AZURE_TENANT_ID",
        "subscription_id": "AZURE_SUBSCRIPTION_ID",
    },
    "openstack": {
        "key": "OS_USERNAME",
        "secret": "OS_PASSWORD",
        "ex_force_auth_url": "OS_AUTH_URL",
        "ex_tenant_name": "OS_PROJECT_NAME",
    },
}
OPTIONAL_ENV = {"ec2": {"token": "AWS_SESSION_TOKEN"}}
# file keys passed on to the constructor besides key and secret
FILE_EXTRAS = {
    "ec2": ("token",),
    "azure_arm": ("tenant_id", "subscription_id"),
    "openstack": ("ex_force_auth_url", "ex_tenant_name", "ex_domain_name", "ex_force_auth_token"),
    "gce": ("project",),
}
# drivers that need no credentials (libcloud's dummy; a plugin's driver says so itself)
NONE_NEEDED = frozenset({"dummy"})


class CredentialsError(BadInput):
    """Credentials are missing or unsafe; the message names where, never what."""

    code = "Credentials"


def resolve(prov: ProviderConfig, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Constructor arguments (``key``, ``secret``, …) for ``prov``'s driver."""
    where = f"providers.{prov.name}.credentials"
    return _resolve(prov.driver, prov.credentials, where, environ)


def resolve_store(store: StoreConfig, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``key``, ``secret`` (and ``token``) of a store: its credentials file, the variables
    it names, or the provider's standard environment (an S3 store AWS's, as the ec2
    driver; an Azure store ``AZURE_STORAGE_ACCOUNT`` and ``AZURE_STORAGE_KEY``; a Google
    store an HMAC key in ``GS_ACCESS_KEY_ID`` and ``GS_SECRET_ACCESS_KEY``)."""
    driver = {"azure_blobs": "azure_blobs", "google_storage": "google_storage"}.get(
        store.driver, "ec2"
    )
    return _resolve(driver, store.credentials, f"stores.{store.name}.credentials", environ)


def _resolve(
    driver: str, creds: Credentials | None, where: str, environ: Mapping[str, str] | None
) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    if creds is not None and creds.file:
        return _from_file(Path(creds.file), where, FILE_EXTRAS.get(driver, ()))
    if creds is not None and (creds.key_env or creds.secret_env):
        return _named_env(creds, where, env)
    if extensions.offers(driver, NONE_NEEDED, lambda d: not d.credentials):
        return {}
    if driver == "gce":
        return _gce_from_env(env, where)
    wanted = STANDARD_ENV.get(driver)
    if wanted is None:
        raise CredentialsError(
            f"{where}: driver {driver} has no standard environment; "
            "set credentials.file or key_env/secret_env"
        )
    missing = [var for var in wanted.values() if not env.get(var)]
    if missing:
        raise CredentialsError(
            f"{where}: not configured, and the standard environment lacks {', '.join(missing)}"
        )
    out = {arg: env[var] for arg, var in wanted.items()}
    out.update({a: env[v] for a, v in OPTIONAL_ENV.get(driver, {}).items() if env.get(v)})
    return out


def check_private(path: Path, what: str) -> None:
    """Refuse a secret file that others may read, or that anyone but root or us could
    change (the StrictModes rule)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise CredentialsError(f"{what} {path}: {exc.strerror}") from None
    problem = not_private(mode)
    if problem:
        raise CredentialsError(f"{what} {path} {problem}")
    why = untrusted(path)
    if why:
        raise CredentialsError(f"{what} {path} can be changed by others: {why}")


def _named_env(creds: Credentials, where: str, env: Mapping[str, str]) -> dict[str, Any]:
    out = {}
    for arg, var in (("key", creds.key_env), ("secret", creds.secret_env)):
        if not var:
            raise CredentialsError(f"{where}: both key_env and secret_env are needed")
        if not env.get(var):
            raise CredentialsError(f"{where}: environment variable {var} is not set")
        out[arg] = env[var]
    return out


def _from_file(path: Path, where: str, extras: tuple[str, ...]) -> dict[str, Any]:
    check_private(path, f"{where}.file")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialsError(f"{where}.file {path}: cannot read it ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        # the parser's message quotes no value, only where
        raise CredentialsError(f"{where}.file {path}: not TOML ({exc})") from None
    out: dict[str, Any] = {}
    for k in ("key", "secret"):
        if not isinstance(data.get(k), str) or not data[k]:
            raise CredentialsError(f"{where}.file {path}: '{k}' is missing or not a string")
        out[k] = data[k]
    for k in extras:
        if k in data:
            out[k] = data[k]
    unknown = set(data) - {"key", "secret", *extras}
    if unknown:
        raise CredentialsError(f"{where}.file {path}: unknown keys {', '.join(sorted(unknown))}")
    return out


def _gce_from_env(env: Mapping[str, str], where: str) -> dict[str, Any]:
    var = "GOOGLE_APPLICATION_CREDENTIALS"
    path = env.get(var)
    if not path:
        raise CredentialsError(f"{where}: not configured, and {var} is not set")
    check_private(Path(path), var)
    try:
        info = json.loads(Path(path).read_text())
        email = info["client_email"]
    except (OSError, ValueError, KeyError, TypeError):
        raise CredentialsError(f"{var} {path}: not a service account key file") from None
    out: dict[str, Any] = {"key": email, "secret": path}
    if info.get("project_id"):
        out["project"] = info["project_id"]
    return out
