"""Prices with validity periods, and money as integer micro-dollars.

A price is looked up for a size, an instant and (optionally) an account. Rates
never change in place: a new price is a new rate with a later ``valid_from``,
so what an instance cost is fixed by the rate valid when it launched, and the
ledger records that rate's name and version next to the price.

Money is an ``int`` of micro-dollars (1e-6 $) everywhere in the core: sums are
exact, and every cent of a bill can be accounted for exactly once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from slurm_burst.core.errors import BadInput
from slurm_burst.core.numbers import is_decimal

MICROS = 1_000_000
MS_PER_HOUR = 3_600_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_ms(t: datetime) -> int:
    """An aware instant as whole milliseconds since the epoch (floor, exact).

    The one conversion used wherever a span is priced, so an instance's cost
    shown by the ledger and the cost split among its jobs are the same number.
    """
    return (t - EPOCH) // _ONE_MS


_ONE_MS = timedelta(milliseconds=1)


class PricingError(BadInput, ValueError):
    """A rate or a money amount that cannot be used."""

    code = "BadPrice"


# No price, rate or budget is a trillion dollars: a larger number is a typo (or 1e308).
MAX_DOLLARS = Decimal(10) ** 12


def to_micros(dollars: float | str | Decimal) -> int:
    """Dollars (as written in a config or on a command line) to integer micro-dollars.

    Rounds half to even. NaN, infinities and amounts of a trillion dollars or more are
    errors.
    """
    if isinstance(dollars, str) and not is_decimal(dollars):  # Decimal reads '٣' and '1_0'
        raise PricingError(f"{dollars[:40]!r} is not an amount of money (ASCII digits)")
    try:
        d = Decimal(str(dollars))
    except InvalidOperation:
        raise PricingError(f"{str(dollars)[:40]!r} is not an amount of money") from None
    if not d.is_finite():
        raise PricingError(f"{str(dollars)[:40]!r} is not an amount of money")
    if abs(d) >= MAX_DOLLARS:
        raise PricingError(f"{str(dollars)[:40]!r} is too large an amount (a trillion or more)")
    return int((d * MICROS).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def dollars(micros: int) -> Decimal:
    """Integer micro-dollars as an exact Decimal of dollars (6 places)."""
    return (Decimal(micros) / MICROS).quantize(Decimal("0.000001"))


def _half_even(num: int, den: int) -> int:
    q, r = divmod(num, den)
    twice = 2 * r
    if twice > den or (twice == den and q % 2):
        q += 1
    return q


def cost_micros(price_micros_per_hour: int, elapsed_ms: int) -> int:
    """Cost of ``elapsed_ms`` at a price per hour, rounded half-even to a micro-dollar.

    Used cumulatively (cost up to t2 minus cost up to t1), so the pieces of an
    interval always add up to the cost of the whole interval.
    """
    return _half_even(price_micros_per_hour * elapsed_ms, MS_PER_HOUR)


GB = 1 << 30  # providers bill data "per GB" of 2^30 bytes


def bytes_cost_micros(n: int, micros_per_gb: int) -> int:
    """Cost of ``n`` bytes at a price per GB (2^30 bytes), rounded half-even to a
    micro-dollar."""
    return _half_even(max(0, n) * micros_per_gb, GB)


MONTH_SECONDS = 730 * 3600  # a month of storage as the providers' GB-month prices count it


def storage_cost_micros(byte_seconds: int, micros_per_gb_month: int) -> int:
    """Cost of ``byte_seconds`` stored at a price per GB-month (2^30 bytes for 730
    hours), rounded half-even to a micro-dollar."""
    return _half_even(max(0, byte_seconds) * micros_per_gb_month, GB * MONTH_SECONDS)


def stored_byte_seconds(items: Iterable[tuple[int, float]], since: float | None, now: float) -> int:
    """Byte-seconds stored by ``items`` (size, when written) from ``since`` (None: each
    from when it was written) until ``now``; whole seconds, nothing before a write."""
    total = 0
    for size, written in items:
        start = written if since is None else max(written, since)
        if size > 0 and now > start:
            total += size * int(now - start)
    return total


def parse_instant(text: str, what: str) -> datetime:
    """``YYYY-MM-DD`` (midnight UTC) or an ISO 8601 time (UTC if no zone given)."""
    try:
        if len(text) == 10:
            d = date.fromisoformat(text)
            return datetime(d.year, d.month, d.day, tzinfo=UTC)
        t = datetime.fromisoformat(text)
    except ValueError:
        raise PricingError(
            f"{what}: {text!r} is not a date (YYYY-MM-DD) or ISO 8601 time"
        ) from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


@dataclass(frozen=True)
class Rate:
    """One price of one size over one period, for everyone or for one account."""

    name: str
    size: str
    micros_per_hour: int
    per: str = "instance"  # or "gpu"
    valid_from: datetime = EPOCH
    valid_to: datetime | None = None
    account: str = ""

    def covers(self, at: datetime) -> bool:
        return self.valid_from <= at and (self.valid_to is None or at < self.valid_to)

    @property
    def version(self) -> str:
        return self.valid_from.strftime("%Y-%m-%dT%H:%M:%SZ")

    def instance_price(self, gpus: int) -> int:
        return self.micros_per_hour * (gpus if self.per == "gpu" else 1)


@dataclass(frozen=True)
class Price:
    micros_per_hour: int
    source: str  # the rate's name
    version: str  # its valid_from


class RateTable:
    """Lookup of the rate in force; account rates win over general ones."""

    def __init__(self, rates: Iterable[Rate]) -> None:
        self.rates = tuple(rates)
        self._by_size: dict[tuple[str, str], list[Rate]] = {}
        for r in self.rates:
            self._by_size.setdefault((r.size, r.account), []).append(r)
        for lst in self._by_size.values():
            lst.sort(key=lambda r: r.valid_from)

    def price(self, size: str, gpus: int, at: datetime, account: str = "") -> Price | None:
        """The per-instance-hour price of ``size`` at ``at`` (for ``account``), or None."""
        for key in ((size, account), (size, "")) if account else ((size, ""),):
            for r in reversed(self._by_size.get(key, [])):  # latest start first
                if r.covers(at):
                    return Price(r.instance_price(gpus), r.name, r.version)
        return None

    def account_overrides(self, size: str, gpus: int, at: datetime) -> dict[str, int]:
        """``{account: micros_per_hour}`` of every account with its own rate at ``at``."""
        out = {}
        for (s, account), lst in self._by_size.items():
            if s != size or not account:
                continue
            for r in reversed(lst):
                if r.covers(at):
                    out[account] = r.instance_price(gpus)
                    break
        return out


def ambiguous(rates: Iterable[Rate]) -> list[tuple[Rate, Rate]]:
    """Pairs of rates for the same size and account starting at the same instant.

    Otherwise periods may overlap on purpose: the rate that started last wins, so a
    price change is one new rate with a later ``valid_from``, and the old one stays.
    """
    seen: dict[tuple[str, str, datetime], Rate] = {}
    out = []
    for r in rates:
        key = (r.size, r.account, r.valid_from)
        if key in seen:
            out.append((seen[key], r))
        else:
            seen[key] = r
    return out


def billing_weight(micros_per_hour: int, units: int) -> int:
    """Slurm TRESBillingWeights value: micro-dollars per minute for one CPU or GPU.

    With this weight, a job's billing TRES is its cost per minute in micro-dollars,
    so GrpTRESMins=billing=N is a budget of N micro-dollars.
    """
    return max(1, round(micros_per_hour / 60 / max(1, units)))
