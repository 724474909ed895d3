"""The CLI reference as Markdown, from the commands themselves (docs/cli.md embeds it)."""

from __future__ import annotations

import click

from slurm_burst.cli.main import cli


def _rows(cmd: click.Command, ctx: click.Context) -> list[tuple[str, str]]:
    if isinstance(cmd, click.Group):
        out = []
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                out += _rows(sub, click.Context(sub, info_name=name, parent=ctx))
        return out
    usage = " ".join(cmd.collect_usage_pieces(ctx)).replace("[OPTIONS]", "").strip()
    flags = []
    for p in cmd.params:
        if isinstance(p, click.Option) and not p.hidden and p.opts[0] not in ("--help", "-h"):
            flag = max(p.opts, key=len)
            flags.append(f"[{flag}]" if p.is_flag else f"[{flag} {p.make_metavar(ctx)}]")
    line = " ".join([ctx.command_path, *flags, usage]).strip()
    return [(line, cmd.get_short_help_str(limit=150))]


def markdown() -> str:
    ctx = click.Context(cli, info_name="slurm-burst")
    rows = _rows(cli, ctx)
    out = ["| command | what it does |", "|---|---|"]
    for line, text in rows:  # a | inside a table cell, even in code, needs its backslash
        out.append("| `" + line.replace("|", "\\|") + "` | " + text.replace("|", "/") + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown())
