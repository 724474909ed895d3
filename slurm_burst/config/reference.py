"""The configuration reference as Markdown, from the model's field docs (README uses it)."""

from __future__ import annotations

import dataclasses
import typing

from slurm_burst.config.model import (
    ClusterConfig,
    Credentials,
    DaemonConfig,
    GpuConfig,
    ImageConfig,
    LedgerConfig,
    MeshConfig,
    NodeGroup,
    PartitionConfig,
    PolicyConfig,
    PolicyOverride,
    ProviderConfig,
    RateConfig,
    SlurmConfig,
    StagingConfig,
    StoreConfig,
)

SECTIONS: list[tuple[str, type]] = [
    ("[cluster]", ClusterConfig),
    ("[slurm]", SlurmConfig),
    ("[partitions.NAME]", PartitionConfig),
    ("[providers.NAME]", ProviderConfig),
    ("[providers.NAME.credentials]", Credentials),
    ("[node_groups.NAME]", NodeGroup),
    ("[mesh]", MeshConfig),
    ("[ledger]", LedgerConfig),
    ("[rates.NAME]", RateConfig),
    ("[daemon]", DaemonConfig),
    ("[gpu]", GpuConfig),
    ("[policy]", PolicyConfig),
    ("[policy.accounts.NAME], [policy.qos.NAME], [policy.partitions.NAME]", PolicyOverride),
    ("[stores.NAME]", StoreConfig),
    ("[staging]", StagingConfig),
    ("[images.NAME]", ImageConfig),
]


def _type(tp: object) -> str:
    text = str(tp).replace("typing.", "").replace("collections.abc.", "")
    return text.replace("<class '", "").replace("'>", "")


def markdown(sections: list[tuple[str, type]] | None = None) -> str:
    """The reference of ``sections`` (default: the product's own; a plugin passes its)."""
    out = []
    for title, cls in SECTIONS if sections is None else sections:
        hints = typing.get_type_hints(cls)
        out.append(f"#### `{title}`\n\n| key | type | default | meaning |\n|---|---|---|---|")
        for f in dataclasses.fields(cls):
            if f.name == "name" and title.endswith(".NAME]"):
                continue
            if f.default is not dataclasses.MISSING:
                default = f"`{f.default!r}`" if f.default not in ((), None) else "—"
            elif f.default_factory is not dataclasses.MISSING:
                default = "—"
            else:
                default = "**required**"
            if not dataclasses.is_dataclass(hints[f.name]):
                out.append(
                    f"| `{f.name}` | {_type(hints[f.name])} | {default} | "
                    f"{f.metadata.get('doc', '')} |"
                )
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown())
