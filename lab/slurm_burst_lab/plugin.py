"""What the lab adds to slurm-burst, through the product's extension points only
(slurm_burst.extensions; the entry point ``lab`` of group ``slurm_burst.plugins``):

- the namespace cloud, a libcloud driver called ``nscloud`` whose VMs print their host
  keys on a console as cloud-init does;
- the ``[lab]`` config section (slurm_burst_lab.config);
- the fault matrix's wrapper around the lab cloud's driver (slurm_burst_lab.faults);
- ``slurm-burst lab``: up, down, status.

Light by design: the hooks read the config, and so load this module; everything else is
named as "module:attribute" and imported only when used.
"""

from __future__ import annotations

from slurm_burst.extensions import CloudDriver, ConfigSection, Plugin
from slurm_burst_lab.config import NAME, LabConfig

NSCLOUD = CloudDriver(
    name="nscloud",
    target="slurm_burst_lab.nscloud.driver:NamespaceNodeDriver",
    host_key_sources={"console": "slurm_burst.adapters.cloud.attest:Console"},
    reads_per_second=50.0,
    credentials=False,
    tag_filter=True,
    spot=True,
    launch_args="slurm_burst_lab.nscloud.driver:launch_args",
    construct="slurm_burst_lab.nscloud.driver:construct",
)

PLUGIN = Plugin(
    name="lab",
    clouds=(NSCLOUD,),
    sections=(ConfigSection(NAME, LabConfig, validate="slurm_burst_lab.config:validate"),),
    driver_wrappers=("slurm_burst_lab.faults:wrap",),
    commands={"lab": "slurm_burst_lab.cli:group"},
)
