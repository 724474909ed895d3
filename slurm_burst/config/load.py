"""Read a config file: TOML parse, schema build, semantic checks, file permissions."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from slurm_burst import extensions
from slurm_burst.config.model import Config
from slurm_burst.config.schema import MAX_DEPTH, Problem, build, key_text, shape_problems
from slurm_burst.config.validate import validate
from slurm_burst.core.errors import BadInput
from slurm_burst.core.redact import has_inline_password
from slurm_burst.core.slurmsyntax import hidden_character
from slurm_burst.extensions import ExtensionError
from slurm_burst.fileio import FileRefused, gid_of, not_private, uid_of, untrusted
from slurm_burst.trusted import Writers, read_checked

DEFAULT_CONFIG_PATH = "/etc/slurm-burst/slurm-burst.toml"
ENV_VAR = "SLURM_BURST_CONFIG"
# option names that hold secrets (ex_force_auth_token, password, api_key, ...)
_SECRET_NAME = re.compile(r"pass(word|wd)?|secret|token|api_?key|private_?key", re.IGNORECASE)
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


CONFIG_MAX = 1024 * 1024  # a config is a few KB; a larger file is not one


class ConfigError(BadInput):
    """A config that cannot be used; ``problems`` lists why (errors only)."""

    code = "ConfigInvalid"

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(p.render(source) for p in problems)
        super().__init__(f"{len(problems)} problem(s) in {source}:\n{lines}")


def resolve_config_path(explicit: str | None) -> Path:
    """--config beats $SLURM_BURST_CONFIG beats the default path."""
    return Path(explicit or os.environ.get(ENV_VAR) or DEFAULT_CONFIG_PATH)


def check_config(
    path: Path, driver_exists: Callable[[str], bool] | None = None, *, references: bool = True
) -> tuple[Config | None, list[Problem]]:
    """Load ``path``; return the config (None if unusable) and every problem found.
    ``references``: read each group's reference runtime manifest too (``config check``;
    the daemon reads it at each join, and a hook never needs it)."""
    source = str(path)
    try:
        data, why = read_checked(path, Writers.us(), CONFIG_MAX, follow=True)
        text = data.decode("utf-8")
    except FileRefused as exc:
        return None, [Problem("", f"cannot read the config: {exc}")]
    except OSError as exc:
        return None, [Problem("", f"cannot read the config: {exc.strerror or exc}")]
    except UnicodeDecodeError as exc:
        return None, [Problem("", f"the config is not UTF-8 text (byte {exc.start})")]
    problems = _untrusted_problem(path, "the config file", why)
    overlays, more = read_dropins(path)
    problems += more
    cfg, more = parse_config(text, source, driver_exists, overlays)
    problems += more
    if cfg is not None:
        problems += _credential_file_problems(cfg) + _program_problems(cfg)
        problems += _group_problems(cfg) + (_runtime_problems(cfg) if references else [])
    lines = dict(_key_lines(text))
    for overlay in overlays:  # a value a drop-in set is not on the config's line
        for key in _dotted(overlay):
            lines.pop(key, None)
    return cfg, [_with_line(p, lines) for p in problems]


def _dotted(table: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in table.items():
        name = f"{prefix}{key}"
        out += _dotted(value, f"{name}.") if isinstance(value, dict) else [name]
    return out


def load_config(path: Path, driver_exists: Callable[[str], bool] | None = None) -> Config:
    """The config at ``path``; ConfigError with every error. A group's reference runtime
    manifest is not read here: a bad one refuses that group's nodes at their join
    (RuntimeReference), never every command and hook (``config check`` says it)."""
    cfg, problems = check_config(path, driver_exists, references=False)
    errors = [p for p in problems if p.severity == "error"]
    if cfg is None or errors:
        raise ConfigError(str(path), errors)
    return cfg


def dropin_dir(path: Path) -> Path:
    """The drop-in directory of the config ``path``: /etc/slurm-burst/slurm-burst.d for
    /etc/slurm-burst/slurm-burst.toml. Its ``*.toml`` files are read after the config,
    in name order; a table of theirs adds to the config's and a key replaces its value
    (``slurm-burst policy tune --apply`` writes one, leaving the config as it is)."""
    return path.with_name(f"{path.stem}.d")


DROPINS_MAX = 64  # files in the drop-in directory


def read_dropins(path: Path) -> tuple[list[dict[str, Any]], list[Problem]]:
    """The parsed drop-ins of the config ``path`` (none without a directory), and what is
    wrong with them, each problem naming its file."""
    where = dropin_dir(path)
    try:
        names = sorted(n for n in os.listdir(where) if n.endswith(".toml") and n[:1] != ".")
    except (FileNotFoundError, NotADirectoryError):
        return [], []
    except OSError as exc:
        return [], [Problem("", f"cannot read the drop-in directory {where}: {exc.strerror}")]
    problems = _file_mode_problems(where, "the drop-in directory")  # its listing
    if len(names) > DROPINS_MAX:
        return [], [Problem("", f"{where}: {len(names)} drop-ins, at most {DROPINS_MAX} read")]
    out = []
    for name in names:
        file = where / name
        try:
            body, why = read_checked(file, Writers.us(), CONFIG_MAX, follow=True)
            problems += _untrusted_problem(file, "the drop-in", why)
            data, wrong = _toml(body.decode("utf-8"))
        except FileRefused as exc:
            problems.append(Problem("", f"cannot read the drop-in: {exc}"))
            continue
        except OSError as exc:
            problems.append(Problem("", f"cannot read the drop-in {file}: {exc.strerror or exc}"))
            continue
        except UnicodeDecodeError as exc:
            problems.append(Problem("", f"the drop-in {file} is not UTF-8 text (byte {exc.start})"))
            continue
        if wrong is not None:
            problems.append(replace(wrong, message=f"{file}: {wrong.message}"))
        else:
            out.append(data)
    return out, problems


def _toml(text: str) -> tuple[dict[str, Any], Problem | None]:
    """``text`` parsed as TOML, or what is wrong with it."""
    try:
        return tomllib.loads(text), None
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line ([0-9]+)", str(exc), re.ASCII)
        return {}, Problem("", f"not valid TOML: {exc}", int(m.group(1)) if m else None)
    except RecursionError:  # tomllib descends into nested arrays and tables recursively
        return {}, Problem("", f"nested more than {MAX_DEPTH} levels deep: no setting is")


def _merge(into: dict[str, Any], over: Mapping[str, Any]) -> None:
    """``over``'s tables added to ``into``'s, its other values replacing theirs."""
    for key, value in over.items():
        mine = into.get(key)
        if isinstance(mine, dict) and isinstance(value, dict):
            _merge(mine, value)
        else:
            into[key] = value


def parse_config(
    text: str,
    source: str = "<string>",
    driver_exists: Callable[[str], bool] | None = None,
    overlays: Sequence[Mapping[str, Any]] = (),
) -> tuple[Config | None, list[Problem]]:
    """``text`` as a config, with ``overlays`` (drop-ins, parsed) over it."""
    data, wrong = _toml(text)
    if wrong is not None:
        return None, [wrong]
    for overlay in overlays:
        _merge(data, overlay)
    problems = shape_problems(data)
    bad = hidden_character(source)
    if bad:  # the path is written into the rendered Slurm files' header
        problems.append(Problem("", f"the config file's path holds {bad}: rename the file"))
    _strip_inline_secrets(data, problems)
    sections = _plugin_sections(data, problems)
    cfg = build(Config, data, "", problems)
    if cfg is None:
        return None, problems
    cfg = replace(cfg, source=source, extensions=MappingProxyType(sections))
    declared = data.get("providers")
    problems += validate(
        cfg,
        driver_exists,
        declared_providers=set(declared) if isinstance(declared, dict) else set(),
    )
    problems += _plugin_problems(cfg)
    return cfg, problems


_OWN_SECTIONS = frozenset(f.name for f in fields(Config) if not f.metadata.get("internal"))


def _plugin_sections(data: dict[str, Any], problems: list[Problem]) -> dict[str, Any]:
    """Take the plugins' top-level tables out of ``data``, each built into its plugin's
    dataclass; a table no plugin owns stays, and the schema says it is unknown."""
    out: dict[str, Any] = {}
    for key in [k for k in data if k not in _OWN_SECTIONS]:
        try:
            section = extensions.config_section(key)
        except ExtensionError as exc:  # said once, for the first table a plugin may own
            data.pop(key)
            problems.append(Problem(key_text(key), str(exc)))
            return out
        if section is None:
            continue
        table = data.pop(key)
        if not isinstance(table, dict):
            problems.append(Problem(key_text(key), "must be a table"))
            continue
        built = build(section.model, table, key_text(key), problems)
        if built is not None:
            out[key] = built
    return out


def _plugin_problems(cfg: Config) -> list[Problem]:
    out: list[Problem] = []
    for name, value in cfg.extensions.items():
        section = extensions.config_section(name)
        if section is not None and section.validate:
            try:
                out += extensions.resolve(section.validate)(value, cfg)
            except ExtensionError as exc:
                out.append(Problem(key_text(name), str(exc)))
    return out


def _strip_inline_secrets(data: dict[str, Any], problems: list[Problem]) -> None:
    """Secrets written in the config are errors (and dropped, so nothing uses them): the
    config is readable by SlurmUser's group, and is shown by 'config show'."""
    providers = data.get("providers")
    if not isinstance(providers, dict):
        return
    for name, prov in providers.items():
        if not isinstance(prov, dict):
            continue
        creds = prov.get("credentials")
        if isinstance(creds, dict):
            for key in [k for k in creds if k in _INLINE_SECRETS]:
                del creds[key]
                problems.append(
                    Problem(
                        f"providers.{name}.credentials.{key}",
                        "secrets are never written in the config; reference them with 'file' "
                        "or 'key_env'/'secret_env'",
                    )
                )
        for table in ("options", "launch_options"):
            values = prov.get(table)
            if not isinstance(values, dict):
                continue
            for key in list(values):
                value = values[key]
                if _SECRET_NAME.search(key) or (
                    isinstance(value, str) and has_inline_password(value)
                ):
                    del values[key]
                    problems.append(
                        Problem(
                            f"providers.{name}.{table}.{key}",
                            "looks like a secret; secrets are never written in the config: "
                            "put it in the credentials file ('credentials.file')",
                        )
                    )


def _untrusted_problem(path: Path, what: str, why: str | None) -> list[Problem]:
    """The StrictModes rule for a file read (``why``, from its descriptor)."""
    return [Problem("", f"{what} {path} can be changed by others: {why}")] if why else []


def _file_mode_problems(path: Path, what: str, secret: bool = False) -> list[Problem]:
    """The StrictModes rule (it chooses what root runs), and private if ``secret``."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return []
    out = []
    why = untrusted(path)
    if why:
        out.append(Problem("", f"{what} {path} can be changed by others: {why}"))
    problem = not_private(mode) if secret else None
    if problem:
        out.append(Problem("", f"{what} {path} {problem}"))
    return out


def _group_problems(cfg: Config) -> list[Problem]:
    out = []
    if gid_of(cfg.daemon.group) is None:
        out.append(Problem(
            "daemon.group",
            f"no group {cfg.daemon.group!r} on this host: the state database, socket "
            "and hook log keep their creator's group, and hooks run as SlurmUser may "
            "be refused (set it to SlurmUser's group)",
            severity="warning",
        ))  # fmt: skip
    if uid_of(cfg.daemon.user) is None:
        out.append(Problem(
            "daemon.user",
            f"no user {cfg.daemon.user!r} on this host: a request the hooks spool is "
            "taken only from root or the daemon's user (set it to SlurmUser)",
            severity="warning",
        ))  # fmt: skip
    return out


def _runtime_problems(cfg: Config) -> list[Problem]:
    """Each group's reference runtime manifest reads; one not there yet is a warning
    (the site captures it once an on-prem node is up; until then the group's nodes are
    refused with RuntimeReference)."""
    from slurm_burst.core.runtime import ManifestError
    from slurm_burst.runtimeref import read_manifest

    out = []
    for name, g in cfg.node_groups.items():
        if not g.runtime_manifest or not g.runtime_manifest.startswith("/"):
            continue
        key = f"node_groups.{name}.runtime_manifest"
        if not os.path.lexists(g.runtime_manifest):
            out.append(Problem(
                key,
                f"{g.runtime_manifest} does not exist (yet): the group's nodes are "
                "refused until it does ('slurm-burst runtime capture' on an on-prem node)",
                severity="warning",
            ))  # fmt: skip
            continue
        try:
            read_manifest(g.runtime_manifest)
        except ManifestError as exc:
            out.append(Problem(key, str(exc)))
    return out


# the programs slurm-burst runs from slurm.bin_dir
SLURM_TOOLS = ("sinfo", "squeue", "scontrol", "sacct", "sacctmgr")


def _program_problems(cfg: Config) -> list[Problem]:
    """The Slurm programs root runs, and the directory they are found in, are nobody
    else's to change."""
    bin_dir = Path(cfg.slurm.bin_dir)
    out = []
    for path in (bin_dir, *(bin_dir / tool for tool in SLURM_TOOLS)):
        why = untrusted(path) if path.exists() else None
        if why:
            out.append(Problem("slurm.bin_dir", f"{path} can be changed by others: {why}"))
            break
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

_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_DOTTED = rf"{_PART}(?:\s*\.\s*{_PART})*"
_HEADER = re.compile(rf"\s*\[\[?\s*({_DOTTED})\s*\]\]?\s*(?:#.*)?", re.ASCII)
_KEYLINE = re.compile(rf"\s*({_DOTTED})\s*=", re.ASCII)


def _keys(dotted: str) -> list[str]:
    """The keys a TOML dotted key names, unquoted and unescaped as TOML reads them."""
    try:
        node: Any = tomllib.loads(f"{dotted} = 0")
    except tomllib.TOMLDecodeError:
        return []
    keys = []
    while isinstance(node, dict) and len(node) == 1:
        key, node = next(iter(node.items()))
        keys.append(key)
    return keys


def _key_lines(text: str) -> Mapping[str, int]:
    """Map key paths to the line that sets them (tables map to their header), both as
    validation names them (raw keys) and as shape checks quote them."""
    lines: dict[str, int] = {}
    table: list[str] = []
    for number, line in enumerate(text.split("\n"), start=1):  # TOML counts only \n
        m = _HEADER.fullmatch(line)
        if m:
            table = _keys(m.group(1))
            keys = table
        else:
            m = _KEYLINE.match(line)
            if not m:
                continue
            keys = table + _keys(m.group(1))
        for join in (".".join(keys), ".".join(key_text(k) for k in keys)):
            lines.setdefault(join, number)
    return lines


def _with_line(p: Problem, lines: Mapping[str, int]) -> Problem:
    if p.line is not None or not p.path:
        return p
    path = re.sub(r"(\[[0-9]+\])+\Z", "", p.path)  # a list's item: the list's line
    while path:
        if path in lines:
            return Problem(p.path, p.message, lines[path], p.severity)
        path = path.rpartition(".")[0]
    return p
