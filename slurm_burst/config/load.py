"""Read a config file: TOML parse, schema build, semantic checks, file permissions."""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from slurm_burst.config.model import Config
from slurm_burst.config.schema import Problem, build
from slurm_burst.config.validate import validate

DEFAULT_CONFIG_PATH = "/etc/slurm-burst/slurm-burst.toml"
ENV_VAR = "SLURM_BURST_CONFIG"
_INLINE_SECRETS = (
    "key",
    "secret",
    "password",
    "token",
    "access_key",
    "secret_key",
    "client_secret",
    "private_key",
)


class ConfigError(Exception):
    """A config that cannot be used; ``problems`` lists why (errors only)."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(p.render(source) for p in problems)
        super().__init__(f"{len(problems)} problem(s) in {source}:\n{lines}")


def resolve_config_path(explicit: str | None) -> Path:
    """--config beats $SLURM_BURST_CONFIG beats the default path."""
    return Path(explicit or os.environ.get(ENV_VAR) or DEFAULT_CONFIG_PATH)


def check_config(
    path: Path, driver_exists: Callable[[str], bool] | None = None
) -> tuple[Config | None, list[Problem]]:
    """Load ``path``; return the config (None if unusable) and every problem found."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return None, [Problem("", f"cannot read the config: {exc.strerror or exc}")]
    problems = _file_mode_problems(path, "the config file")
    cfg, more = parse_config(text, source, driver_exists)
    problems += more
    if cfg is not None:
        problems += _credential_file_problems(cfg)
    lines = _key_lines(text)
    return cfg, [_with_line(p, lines) for p in problems]


def load_config(path: Path, driver_exists: Callable[[str], bool] | None = None) -> Config:
    cfg, problems = check_config(path, driver_exists)
    errors = [p for p in problems if p.severity == "error"]
    if cfg is None or errors:
        raise ConfigError(str(path), errors)
    return cfg


def parse_config(
    text: str, source: str = "<string>", driver_exists: Callable[[str], bool] | None = None
) -> tuple[Config | None, list[Problem]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        return None, [Problem("", f"not valid TOML: {exc}", int(m.group(1)) if m else None)]
    problems: list[Problem] = []
    _strip_inline_secrets(data, problems)
    cfg = build(Config, data, "", problems)
    if cfg is None:
        return None, problems
    cfg = _with_source(cfg, source)
    declared = data.get("providers")
    problems += validate(
        cfg,
        driver_exists,
        declared_providers=set(declared) if isinstance(declared, dict) else set(),
    )
    return cfg, problems


def _with_source(cfg: Config, source: str) -> Config:
    from dataclasses import replace

    return replace(cfg, source=source)


def _strip_inline_secrets(data: dict[str, Any], problems: list[Problem]) -> None:
    providers = data.get("providers")
    if not isinstance(providers, dict):
        return
    for name, prov in providers.items():
        creds = prov.get("credentials") if isinstance(prov, dict) else None
        if not isinstance(creds, dict):
            continue
        for key in [k for k in creds if k in _INLINE_SECRETS]:
            del creds[key]
            problems.append(
                Problem(
                    f"providers.{name}.credentials.{key}",
                    "secrets are never written in the config; reference them with 'file' "
                    "or 'key_env'/'secret_env'",
                )
            )


def _file_mode_problems(path: Path, what: str, secret: bool = False) -> list[Problem]:
    try:
        mode = path.stat().st_mode
    except OSError:
        return []
    out = []
    if mode & stat.S_IWOTH:
        out.append(Problem("", f"{what} {path} is world-writable (chmod o-w)"))
    if secret and mode & stat.S_IROTH:
        out.append(Problem("", f"{what} {path} is world-readable (chmod 600)"))
    return out


def _credential_file_problems(cfg: Config) -> list[Problem]:
    out: list[Problem] = []
    for name, prov in cfg.providers.items():
        creds = prov.credentials
        if creds is None:
            continue
        path = f"providers.{name}.credentials"
        if creds.file:
            f = Path(creds.file)
            if not f.exists():
                out.append(Problem(f"{path}.file", f"credentials file {f} does not exist"))
            for p in _file_mode_problems(f, "credentials file", secret=True):
                out.append(Problem(f"{path}.file", p.message))
        for key in ("key_env", "secret_env"):
            var = getattr(creds, key)
            if var and var not in os.environ:
                out.append(
                    Problem(
                        f"{path}.{key}",
                        f"environment variable {var} is not set here",
                        severity="warning",
                    )
                )
    return out


# --- line numbers ----------------------------------------------------------

_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEYLINE = re.compile(r"^\s*([A-Za-z0-9_.\"'-]+(?:\s*\.\s*[A-Za-z0-9_\"'-]+)*)\s*=")


def _dotted(text: str) -> str:
    return ".".join(part.strip().strip("\"'") for part in text.split("."))


def _key_lines(text: str) -> Mapping[str, int]:
    """Map key paths to the line that sets them (tables map to their header)."""
    lines: dict[str, int] = {}
    table = ""
    for number, line in enumerate(text.splitlines(), start=1):
        m = _HEADER.match(line)
        if m:
            table = _dotted(m.group(1))
            lines.setdefault(table, number)
            continue
        m = _KEYLINE.match(line)
        if m:
            key = _dotted(m.group(1))
            lines.setdefault(f"{table}.{key}" if table else key, number)
    return lines


def _with_line(p: Problem, lines: Mapping[str, int]) -> Problem:
    if p.line is not None or not p.path:
        return p
    path = p.path
    while path:
        if path in lines:
            return Problem(p.path, p.message, lines[path], p.severity)
        path = path.rpartition(".")[0]
    return p
