"""Provider credentials: found where the config says, handed to the driver, never shown.

Three sources, in this order of precedence:

1. ``credentials.file``: a TOML file (mode 0600 or stricter; a file others can read
   is refused) with ``key`` and ``secret``, and for some drivers more (below);
2. ``credentials.key_env`` / ``credentials.secret_env``: environment variables named
   in the config;
3. neither: the provider's standard environment (``AWS_ACCESS_KEY_ID``…,
   ``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_CLIENT_ID``…, ``OS_USERNAME``…).

What each driver's constructor gets (libcloud's names; each provider's module says
which variables and file keys, :mod:`slurm_burst.adapters.cloud.providers`):

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

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurm_burst.adapters.cloud.registry import provider
from slurm_burst.config import Credentials, ProviderConfig
from slurm_burst.config.model import StoreConfig
from slurm_burst.core.errors import BadInput
from slurm_burst.fileio import not_private, untrusted

# a store's standard environment, by its driver: {argument: variable} (S3 and anything
# else speaking its API: AWS's variables)
STORE_ENV: dict[str, dict[str, str]] = {
    "azure_blobs": {"key": "AZURE_STORAGE_ACCOUNT", "secret": "AZURE_STORAGE_KEY"},
    # a service account's HMAC key, as gsutil's boto configuration names them
    "google_storage": {"key": "GS_ACCESS_KEY_ID", "secret": "GS_SECRET_ACCESS_KEY"},
}
AWS_ENV = {"key": "AWS_ACCESS_KEY_ID", "secret": "AWS_SECRET_ACCESS_KEY"}
AWS_OPTIONAL = {"token": "AWS_SESSION_TOKEN"}


class CredentialsError(BadInput):
    """Credentials are missing or unsafe; the message names where, never what."""

    code = "Credentials"


def resolve(prov: ProviderConfig, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Constructor arguments (``key``, ``secret``, …) for ``prov``'s driver."""
    where = f"providers.{prov.name}.credentials"
    env = os.environ if environ is None else environ
    described = provider(prov.driver)
    creds = prov.credentials
    if creds is not None and creds.file:
        return _from_file(Path(creds.file), where, described.file_extras)
    if creds is not None and (creds.key_env or creds.secret_env):
        return _named_env(creds, where, env)
    if not described.needs_credentials:
        return {}
    found = described.credentials_from_env(env, where)
    if found is not None:
        return found
    if not described.standard_env:
        raise CredentialsError(
            f"{where}: driver {prov.driver} has no standard environment; "
            "set credentials.file or key_env/secret_env"
        )
    return _standard(described.standard_env, described.optional_env, where, env)


def resolve_store(store: StoreConfig, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``key``, ``secret`` (and ``token``) of a store: its credentials file, the variables
    it names, or the provider's standard environment (an S3 store AWS's; an Azure store
    ``AZURE_STORAGE_ACCOUNT`` and ``AZURE_STORAGE_KEY``; a Google store an HMAC key in
    ``GS_ACCESS_KEY_ID`` and ``GS_SECRET_ACCESS_KEY``)."""
    where = f"stores.{store.name}.credentials"
    env = os.environ if environ is None else environ
    creds = store.credentials
    wanted = STORE_ENV.get(store.driver)
    if creds is not None and creds.file:
        return _from_file(Path(creds.file), where, () if wanted else tuple(AWS_OPTIONAL))
    if creds is not None and (creds.key_env or creds.secret_env):
        return _named_env(creds, where, env)
    return _standard(wanted or AWS_ENV, {} if wanted else AWS_OPTIONAL, where, env)


def _standard(
    wanted: Mapping[str, str], optional: Mapping[str, str], where: str, env: Mapping[str, str]
) -> dict[str, Any]:
    missing = [var for var in wanted.values() if not env.get(var)]
    if missing:
        raise CredentialsError(
            f"{where}: not configured, and the standard environment lacks {', '.join(missing)}"
        )
    out = {arg: env[var] for arg, var in wanted.items()}
    out.update({a: env[v] for a, v in optional.items() if env.get(v)})
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
