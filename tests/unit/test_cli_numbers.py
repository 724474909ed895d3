"""Every number option of every command reads ASCII digits only, and every account or
QOS option a Slurm name only (hardening round three, class 5): click's ``IntRange`` and
``FloatRange`` call ``int()`` and ``float()``, which read '٣', '1_0', ' 7' and 'nan'.

Generated: for each number option, a value in its range spelled another way (other
scripts' digits, an underscore, a sign, blanks, a control character) is refused with
exit 2 before any config is read; the same value in ASCII is taken.
"""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_burst.cli.common import FiniteRange, SlurmName, Whole
from slurm_burst.cli.main import cli
from slurm_burst.core.numbers import is_decimal
from slurm_burst.core.pricing import PricingError, to_micros
from tests.conftest import examples

NO_CONFIG = "/nonexistent/slurm-burst.toml"  # conversion comes before the config is read


def _options() -> list[tuple[tuple[str, ...], click.Parameter]]:
    out: list[tuple[tuple[str, ...], click.Parameter]] = []

    def walk(cmd: click.Command, path: tuple[str, ...], ctx: click.Context) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None:
                    walk(sub, (*path, name), click.Context(sub, info_name=name, parent=ctx))
            return
        out.extend((path, p) for p in cmd.params)

    walk(cli, (), click.Context(cli, info_name="slurm-burst"))
    return out


PARAMS = _options()
NUMBERS = [
    (path, p)
    for path, p in PARAMS
    if isinstance(p, click.Option) and isinstance(p.type, click.types._NumberParamTypeBase)
]


def test_every_number_option_reads_ascii_digits_only() -> None:
    assert len(NUMBERS) >= 10, "the walk found the number options"
    loose = [
        f"{' '.join(path)} {p.opts[0]}: {type(p.type).__name__}"
        for path, p in NUMBERS
        if not isinstance(p.type, Whole | FiniteRange)
    ]
    assert not loose, "click's own number types read '٣' and '1_0':\n" + "\n".join(loose)


def test_every_account_or_qos_option_is_a_slurm_name() -> None:
    named = [(path, p) for path, p in PARAMS if p.name in ("account", "qos")]
    assert named, "the walk found account options"
    loose = [
        f"{' '.join(path)} {p.opts[0]}" for path, p in named if not isinstance(p.type, SlurmName)
    ]
    assert loose == ["budget set account"], loose  # budget set checks its own (is_name)


def _in_range(p: click.Parameter) -> float:
    t = p.type
    assert isinstance(t, click.types._NumberRangeBase)
    low = t.min if t.min is not None else 0
    return low + 1 if isinstance(t, Whole) else low


# other scripts' digits that int() and float() read: Arabic-Indic, Devanagari, fullwidth,
# mathematical bold (their zeros' code points)
SCRIPTS = ["".join(chr(zero + i) for i in range(10)) for zero in (0x660, 0x966, 0xFF10, 0x1D7CE)]


@st.composite
def respelled(draw: st.DrawFn, text: str) -> str:
    """``text`` (ASCII digits) spelled in a way int() or float() would still read."""
    how = draw(st.sampled_from(["script", "underscore", "sign", "blank", "control"]))
    if how == "script":
        digits = draw(st.sampled_from(SCRIPTS))
        return "".join(digits[int(c)] if c.isdigit() else c for c in text)
    if how == "underscore":
        return text[0] + "_" + text[1:] if len(text) > 1 else text + "_0"
    if how == "sign":
        return "+" + text
    if how == "blank":
        return draw(st.sampled_from([" ", "\t", "\n", "\u00a0", "\u2003"])) + text
    return text + draw(st.sampled_from(["\r", "\x00", "\x0b", "\u0085", "\u2028"]))


@settings(max_examples=examples(200))
@given(data=st.data())
@pytest.mark.parametrize(
    ("path", "p"), NUMBERS, ids=[f"{' '.join(x)} {p.opts[0]}" for x, p in NUMBERS]
)
def test_a_number_spelled_another_way_is_refused(
    path: tuple[str, ...], p: click.Option, data: st.DataObject
) -> None:
    value = _in_range(p)
    text = str(int(value)) if isinstance(p.type, Whole) else f"{value:g}"
    # taken in ASCII ...
    assert p.type.convert(text, p, None) == pytest.approx(value)
    # ... refused in any other spelling, before anything runs
    other = data.draw(respelled(text))
    with pytest.raises(click.BadParameter):
        p.type.convert(other, p, None)
    flag = max(p.opts, key=len)
    result = CliRunner().invoke(cli, ["--config", NO_CONFIG, *path, flag, other])
    assert result.exit_code == 2, (other, result.output)
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "ASCII" in result.output, result.output


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e999", "NaN", "Infinity", "0x1p3"])
def test_no_decimal_option_takes_what_is_not_a_finite_number(text: str) -> None:
    for _path, p in NUMBERS:
        if isinstance(p.type, FiniteRange):
            with pytest.raises(click.BadParameter):
                p.type.convert(text, p, None)


@given(st.text(max_size=12))
def test_what_is_decimal_takes_is_ascii_and_float_reads_it(text: str) -> None:
    if is_decimal(text):
        assert text.strip().isascii(), text
        float(text)  # reads it (1e999 as inf: the option's finite check refuses that)


@pytest.mark.parametrize("text", ["٣", "1_0", "NaN", "Infinity", "\uff11\uff10", "0x10", "1,5"])
def test_an_amount_of_money_is_ascii_digits(text: str) -> None:
    with pytest.raises(PricingError):
        to_micros(text)
    assert to_micros("12.5") == 12_500_000


@pytest.mark.parametrize(
    "text", ["HIPAA\n", "phys ics", "\udcff", "physics\x00", "é", "-x", "a" * 65, "x\u202e"]
)
def test_a_name_that_is_not_slurms_is_refused(text: str) -> None:
    result = CliRunner().invoke(
        cli, ["--config", NO_CONFIG, "ledger", "transfers", "--account", text]
    )
    assert result.exit_code == 2 and "is not a Slurm account name" in result.output, result.output
    assert "\x00" not in result.output and "\u202e" not in result.output, result.output


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,20}", fullmatch=True))
def test_a_name_is_compared_as_slurm_does_without_case(name: str) -> None:
    t = SlurmName("QOS")
    assert t.convert(name, None, None) == name.lower() == t.convert(name.swapcase(), None, None)
