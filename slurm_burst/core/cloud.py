"""Cloud instances and cloud errors in our own terms (adapters translate libcloud's).

Errors keep the provider's code (``InsufficientInstanceCapacity``...) because it
ends up in the Slurm node reason as ``(Code:...)``, the way operators search for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from slurm_burst.core.errors import BurstError

# The tags every instance we make carries (GCE: as labels). The token tag is the
# launch's idempotency token: a retry looks for it before it launches again.
CLUSTER_TAG = "slurm-burst-cluster"
NODE_TAG = "slurm-burst-node"
GROUP_TAG = "slurm-burst-group"
TOKEN_TAG = "slurm-burst-token"  # noqa: S105 - a tag name, not a secret
SPOT_WAIT_CODE = "SpotCapacityWait"  # a spot launch's capacity did not come in time


@dataclass(frozen=True)
class LaunchSpec:
    node: str
    cluster: str
    group: str
    size: str
    image: str
    token: str  # idempotency token: the same token never makes a second instance
    ssh_public_key: str
    user_data: str
    tags: dict[str, str] = field(default_factory=dict)
    spot: bool = False
    spot_max_price: float = 0.0  # 0: the provider's on-demand price caps it
    gpus: int = 0
    accelerator: str = ""  # the provider's accelerator type (GCE: nvidia-tesla-t4)
    disk_gb: int = 0  # 0: the image's root disk
    count: int = 1  # instances in this one call (a batch: the same spec, ``count`` times)
    min_count: int = 0  # fewest instances the call may make (0: ``count``, all or none)
    placement_group: str = ""  # the placement group the instances go in ('' : none)
    placement_kind: str = ""  # the group's placement (a provider offering two: Azure)
    # a spot launch whose call waits for the capacity itself (Azure's scale-out): the
    # most it waits before it gives up with SPOT_WAIT_CODE (0: no bound of its own)
    spot_wait: float = 0.0
    names: tuple[str, ...] = ()  # a batch's nodes, in order: who names instances at launch


class Instance(NamedTuple):
    """A cloud instance (a NamedTuple: a provider listing can hold tens of thousands)."""

    id: str
    name: str
    state: str  # pending, running, terminated, error, unknown, ...
    provider: str
    size: str = ""
    public_ips: tuple[str, ...] = ()
    private_ips: tuple[str, ...] = ()
    tags: Mapping[str, str] = MappingProxyType({})
    launch_index: int = 0  # position in the launch call that made it (EC2 amiLaunchIndex)
    fault: str = ""  # why the provider put it in error (OpenStack's server fault)

    @property
    def address(self) -> str:
        """Where the daemon reaches the instance's sshd (public first)."""
        ips = self.public_ips or self.private_ips
        return ips[0] if ips else ""


class CloudError(BurstError):
    """A cloud call failed; ``code`` is the provider's error code (or ours)."""

    code = "CloudError"
    retryable = False


class CapacityError(CloudError):
    code = "InsufficientInstanceCapacity"


class ThrottledError(CloudError):
    code = "RequestLimitExceeded"
    retryable = True
    after = 0.0  # seconds the provider said to wait (Retry-After); 0: not said
    counted = False  # counted and paced already where it was answered (a metered request)


class Busy(ThrottledError):
    """Our own budget for the API has no token now (no call was made): try again in
    ``after`` seconds. Raised only to callers that asked not to wait."""

    code = "ApiBudget"

    def __init__(self, message: str, after: float) -> None:
        super().__init__(message, self.code)
        self.after = after


class AuthError(CloudError):
    code = "AuthFailure"


class QuotaError(CloudError):
    code = "InstanceLimitExceeded"


class NotFoundError(CloudError):
    code = "InvalidInstanceID.NotFound"


class InUseError(CloudError):
    """The resource still holds something (EC2: a placement group with instances in it,
    shutting down ones included): try again later."""

    code = "InvalidPlacementGroup.InUse"


class ExistsError(CloudError):
    """What the call would make exists already (a repeated create: done)."""

    code = "InvalidPlacementGroup.Duplicate"


# Provider error codes -> our types; the code itself is kept on the error.
CODES: dict[str, type[CloudError]] = {
    "InsufficientInstanceCapacity": CapacityError,
    "InsufficientHostCapacity": CapacityError,
    "InsufficientCapacity": CapacityError,
    "SpotMaxPriceTooLow": CapacityError,
    "ZONE_RESOURCE_POOL_EXHAUSTED": CapacityError,
    "SkuNotAvailable": CapacityError,
    "OverconstrainedAllocationRequest": CapacityError,  # Azure
    "RequestLimitExceeded": ThrottledError,
    "Throttling": ThrottledError,
    "ServiceUnavailable": ThrottledError,
    "rateLimitExceeded": ThrottledError,
    "SubscriptionRequestsThrottled": ThrottledError,  # Azure ARM, 429
    "AuthFailure": AuthError,
    "UnauthorizedOperation": AuthError,
    "InvalidClientTokenId": AuthError,
    "InstanceLimitExceeded": QuotaError,
    "QUOTA_EXCEEDED": QuotaError,
    "quotaExceeded": QuotaError,  # GCE, 403
    "InvalidInstanceID.NotFound": NotFoundError,
    "InvalidPlacementGroup.Unknown": NotFoundError,
    "InvalidPlacementGroup.InUse": InUseError,
    "InvalidPlacementGroup.Duplicate": ExistsError,
}


# Providers whose errors carry no code, only text: (text, our code, type).
PHRASES: tuple[tuple[str, str, type[CloudError]], ...] = (
    ("Quota exceeded", "QuotaExceeded", QuotaError),  # OpenStack Nova, 403
    ("No valid host was found", "NoValidHost", CapacityError),  # Nova's scheduler
    ("OperationNotAllowed", "OperationNotAllowed", QuotaError),  # Azure: quota
    ("ZonalAllocationFailed", "ZonalAllocationFailed", CapacityError),  # Azure: capacity
    ("AllocationFailed", "AllocationFailed", CapacityError),
    ("TooManyRequests", "TooManyRequests", ThrottledError),  # Azure ARM, 429
)


def classify(message: str) -> CloudError:
    """A typed error from provider text such as ``InsufficientInstanceCapacity: ...``."""
    for code, cls in CODES.items():
        if code in message:
            return cls(message, code)
    for phrase, code, cls in PHRASES:
        if phrase in message:
            return cls(message, code)
    return CloudError(message)


def backoff(attempt: int, base: float, cap: float, u: float) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): "full jitter".

    ``u`` is a uniform random number in [0, 1), passed in so the core stays pure.
    Full jitter spreads the retries of many callers throttled at once
    (AWS Architecture Blog, "Exponential Backoff And Jitter").
    """
    return u * min(cap, base * 2.0**attempt)
