"""Provider credentials (file, named variables, the provider's standard environment;
unsafe files refused, nothing secret in errors) and ``slurm-burst prices check``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_burst.adapters.cloud.credentials import CredentialsError, resolve
from slurm_burst.config import Credentials, ProviderConfig
from tests.conftest import invoke
from tests.unit.test_config import GOOD, write

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def prov(driver: str, creds: Credentials | None = None) -> ProviderConfig:
    return ProviderConfig(name="p", driver=driver, credentials=creds)


def test_file_credentials_are_read_and_a_readable_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "aws.toml"
    f.write_text(f'key = "AKIDEXAMPLE"\nsecret = "{SECRET}"\n')
    f.chmod(0o600)
    assert resolve(prov("ec2", Credentials(file=str(f)))) == {
        "key": "AKIDEXAMPLE",
        "secret": SECRET,
    }
    for mode in (0o644, 0o640, 0o660, 0o604):
        f.chmod(mode)
        with pytest.raises(CredentialsError, match="only its owner may read it") as err:
            resolve(prov("ec2", Credentials(file=str(f))))
        assert SECRET not in str(err.value)


def test_a_broken_file_names_the_problem_not_the_secret(tmp_path: Path) -> None:
    f = tmp_path / "aws.toml"
    f.write_text(f'key = "AKIDEXAMPLE"\nsecret = "{SECRET}\n')  # unterminated string
    f.chmod(0o600)
    with pytest.raises(CredentialsError, match="not TOML") as err:
        resolve(prov("ec2", Credentials(file=str(f))))
    assert SECRET not in str(err.value)
    f.write_text('key = "AKIDEXAMPLE"\n')
    with pytest.raises(CredentialsError, match="'secret' is missing"):
        resolve(prov("ec2", Credentials(file=str(f))))


def test_named_variables_and_the_standard_environment() -> None:
    named = Credentials(key_env="MY_KEY", secret_env="MY_SECRET")
    assert resolve(prov("ec2", named), {"MY_KEY": "k", "MY_SECRET": "s"}) == {
        "key": "k",
        "secret": "s",
    }
    with pytest.raises(CredentialsError, match="MY_SECRET is not set"):
        resolve(prov("ec2", named), {"MY_KEY": "k"})
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t"}
    assert resolve(prov("ec2"), env) == {"key": "k", "secret": "s", "token": "t"}
    azure = {
        "AZURE_CLIENT_ID": "app",
        "AZURE_CLIENT_SECRET": "pw",
        "AZURE_TENANT_ID": "tenant",
        "AZURE_SUBSCRIPTION_ID": "sub",
    }
    assert resolve(prov("azure_arm"), azure)["tenant_id"] == "tenant"
    with pytest.raises(CredentialsError, match="AZURE_SUBSCRIPTION_ID"):
        resolve(prov("azure_arm"), {k: v for k, v in azure.items() if "SUB" not in k})
    assert resolve(prov("nscloud"), {}) == {}


def test_gce_service_account_from_google_application_credentials(tmp_path: Path) -> None:
    sa = tmp_path / "sa.json"
    sa.write_text(
        json.dumps({"client_email": "burst@proj.iam.gserviceaccount.com", "project_id": "proj"})
    )
    sa.chmod(0o600)
    out = resolve(prov("gce"), {"GOOGLE_APPLICATION_CREDENTIALS": str(sa)})
    assert out == {
        "key": "burst@proj.iam.gserviceaccount.com",
        "secret": str(sa),
        "project": "proj",
    }
    sa.chmod(0o604)
    with pytest.raises(CredentialsError, match="chmod 600"):
        resolve(prov("gce"), {"GOOGLE_APPLICATION_CREDENTIALS": str(sa)})


def test_prices_check_lists_sources_and_fails_on_an_unpriced_size(tmp_path: Path) -> None:
    good = write(tmp_path, GOOD)
    out = json.loads(invoke(["--config", str(good), "prices", "check", "--json"]).stdout)
    assert out["unpriced"] == 0
    assert {(r["size"], r["price_per_hour"]) for r in out["sizes"]} == {
        ("g5.xlarge", 1.006),
        ("g5.2xlarge", 1.212),
    }
    unpriced = write(tmp_path, GOOD.replace(', "g5.2xlarge" = 1.212', ""))
    res = invoke(["--config", str(unpriced), "prices", "check"], expect=1)
    assert "size g5.2xlarge (aws) has no price" in res.stderr
    assert "NO PRICE" in res.stdout
