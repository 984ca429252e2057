"""click parameter types that read numbers as Go's pflag does (``blis_fast.gonum``).

Every numeric flag of every ``blis`` subcommand uses these, so ``--rate 0x1p4`` and
``--rate ' 5'`` mean the same (accepted, refused) whichever command reads them.
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
