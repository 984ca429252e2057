"""click parameter types that read numbers as Go's pflag does (``blis_fast.gonum``).

Every numeric flag of every ``blis`` subcommand uses these, so ``--rate 0x1p4`` and
``--rate ' 5'`` mean the same (accepted, refused, with the same message) whichever command
reads them. ``flag_number`` parses a flag inside a command's body, where other checks must
come first, with the same parser and message.
"""

from __future__ import annotations

from typing import Any

import click

from blis_fast.gonum import NumError, parse_float, parse_int


class GoInt(click.ParamType):
    """An ``int``/``int64`` flag: ``strconv.ParseInt(s, 0, 64)``."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        if isinstance(value, int) and not isinstance(value, bool):
            return value  # a default
        try:
            return parse_int(str(value), 0, 64)
        except NumError as exc:
            self.fail(str(exc), param, ctx)


class GoFloat(click.ParamType):
    """A ``float64`` flag: ``strconv.ParseFloat(s, 64)``."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        if isinstance(value, float):
            return value  # a default
        try:
            return parse_float(str(value))
        except NumError as exc:
            self.fail(str(exc), param, ctx)


GO_INT = GoInt()
GO_FLOAT = GoFloat()


def flag_number(kind: GoInt | GoFloat, flag: str, text: str) -> int | float:
    """The value of ``--flag`` read by ``kind`` (GO_INT or GO_FLOAT); an error reads as
    click's for a typed option (``Invalid value for '--flag': ...``)."""
    try:
        return kind.convert(text, None, None)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint=f"'--{flag}'") from None
