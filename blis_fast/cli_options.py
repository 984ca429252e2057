"""click options made from ``OptionSpec`` rows, and ``--help`` that tells the truth about them.

``blis run``, ``blis replay`` and ``blis observe`` build their flags from the rows of
``blis_fast.options`` (observe adds rows of its own): each flag's help line shows what it takes
(INTEGER, FLOAT, PATH, a policy family's names), its real default, and sits under its row's
group heading. What a flag shows never changes how it is parsed: ``blis run``'s values reach
``options.coerce`` (the reference's Go parsers) as the text given, through :class:`TextAs`;
``blis observe`` converts with ``cli_numbers``' Go types at parse time, as it always has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from blis_fast.cli_numbers import GO_FLOAT, GO_INT
from blis_fast.options import RUN_OPTIONS, OptionSpec
from blis_fast.policies import family

OTHER_OPTIONS = "Other options"
"""The heading of options that come from no row (``--help``)."""


def help_text(spec: OptionSpec, *, names: bool = True) -> str:
    """A row's help line; a policy flag lists its family's names (loads the registry), or with
    ``names=False`` (``--help``, whose value column lists them) only the names a user function
    runs under."""
    if not spec.choices:
        return spec.help
    registry = family(spec.choices)
    if names:
        return f"{spec.help}: {registry.help_names()}"
    hooks = [name for name, e in registry.entries.items() if getattr(e, "hook", "")]
    return f"{spec.help} ({', '.join(hooks)} through the Python API)" if hooks else spec.help


def value_name(spec: OptionSpec) -> str:
    """What ``--help`` shows a row's flag takes: INTEGER, FLOAT, FLOAT,... (a comma-separated
    list), PATH, DIRECTORY, TEXT, a policy family's names (loads the registry) or the row's
    ``values`` as ``[a|b|c]``, or "" for a switch. Display only: values are parsed by
    ``options.coerce`` and checked by the row's checks."""
    if spec.kind == "bool":
        return ""
    if spec.values:
        return "[" + "|".join(spec.values) + "]"
    if spec.choices:
        return "[" + "|".join(family(spec.choices).valid_names()) + "]"
    if spec.file:
        return "DIRECTORY" if spec.file == "input-folder" else "PATH"
    return {"int": "INTEGER", "float": "FLOAT", "floats": "FLOAT,..."}.get(spec.kind, "TEXT")


class TextAs(click.ParamType):
    """A parameter type that keeps the text as given (the rows' own parsers read it later)
    and is named like the type the row holds, for anything that shows the name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        return value


_RAW_TYPES = {"int": TextAs("integer"), "float": TextAs("float"), "floats": TextAs("floats"),
              "str": TextAs("text")}
"""``blis run``'s parameter types: the text passes through, the name says what it holds."""
_PARSED_TYPES: dict[str, Any] = {"int": GO_INT, "float": GO_FLOAT, "str": click.STRING}
"""``blis observe``'s parameter types: numbers parsed as Go's pflag does, at parse time."""


class RowOption(click.Option):
    """A flag made from an OptionSpec row: its help line is made when help is shown (a
    policy flag's value column lists its registry's names, and the registries are not loaded
    otherwise), with the row's value name and the default the command really uses."""

    def __init__(self, *args: Any, spec: OptionSpec, shown_default: Any = None,
                 default_note: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spec = spec
        self.shown_default = shown_default
        self.default_note = default_note

    def make_metavar(self, ctx: click.Context) -> str:
        return value_name(self.spec) or super().make_metavar(ctx)

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        text = help_text(self.spec, names=False)
        default = self.spec.default_text(self.shown_default)
        if default:
            note = f" ({self.default_note})" if self.default_note else ""
            text = f"{text} [default: {default}{note}]"
        self.help = text
        return super().get_help_record(ctx)


class GroupedHelpCommand(click.Command):
    """A command whose ``--help`` lists its options under their rows' group headings, the
    groups in the order of their first option; options of no row come last."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None or isinstance(param, click.Argument):
                continue
            heading = param.spec.group if isinstance(param, RowOption) else OTHER_OPTIONS
            sections.setdefault(heading or OTHER_OPTIONS, []).append(record)
        for heading, records in sections.items():
            with formatter.section(heading):
                formatter.write_dl(records)


def row_option(spec: OptionSpec, *, parsed: bool, default: Any = None, default_note: str = "",
               callback: Callable[..., Any] | None = None) -> Callable[[Any], Any]:
    """The click decorator of one row's flag.

    ``parsed=False`` (``blis run``/``replay``): the value stays the text given (None when the
    flag is absent), a repeated list flag joins its items later. ``parsed=True`` (``blis
    observe``): the value is converted at parse time (Go's numbers) and an absent flag takes
    ``default`` (the row's unless the command states its own).
    """
    shown = spec.default if default is None else default
    common: dict[str, Any] = {"cls": RowOption, "spec": spec, "shown_default": shown,
                              "default_note": default_note}
    flag, name = f"--{spec.flag}", spec.field
    if spec.kind == "bool":
        return click.option(flag, name, is_flag=True, default=shown if parsed else spec.default,
                            **common)
    if parsed:
        return click.option(flag, name, type=_PARSED_TYPES[spec.kind], default=shown,
                            show_default=False, **common)
    if spec.kind == "floats":  # pflag Float64Slice: a repeated flag appends its items
        return click.option(flag, name, type=_RAW_TYPES["floats"], multiple=True, **common)
    return click.option(flag, name, type=_RAW_TYPES[spec.kind], default=None,
                        show_default=False, callback=callback, **common)


def raw_value_is_not_a_flag(ctx: click.Context, param: click.Parameter,
                            value: str | None) -> str | None:
    """Refuse a value that is another flag (``--rate --seed 5``): the user left the value out,
    and click would otherwise report the flag's own value as an unexpected extra argument."""
    if value is not None and value.startswith("--") and len(value) > 2:
        name = value[2:].split("=", 1)[0]
        if any(spec.flag == name for spec in RUN_OPTIONS):
            raise click.UsageError(f"Option '{param.opts[0]}' requires a value "
                                   f"(got the flag {value})")
    return value


def add_run_options(func: Any, skip: frozenset[str]) -> Any:
    """Attach the RUN_OPTIONS flags (minus ``skip``) to a click command (raw string values)."""
    for spec in reversed(RUN_OPTIONS):
        if spec.flag not in skip:
            func = row_option(spec, parsed=False, callback=raw_value_is_not_a_flag)(func)
    return func


__all__ = ["OTHER_OPTIONS", "GroupedHelpCommand", "RowOption", "TextAs", "add_run_options",
           "raw_value_is_not_a_flag", "row_option"]
