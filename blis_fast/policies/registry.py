"""The one registry type of every policy family: names → entries, and what derives from them.

A family module (``admission.py``, ``routing.py``, ...) makes one ``Registry`` and registers
one entry per implementation, one ``register`` call each. Every other module reads names,
kernel codes, parameters and help texts from the registry instead of restating them:
``valid_names()`` (what a bundle or a flag may name), ``code(name)`` (the kernel's integer),
``help_names()`` (the CLI help), and each entry's parameters (bundle keys, defaults, checks,
kernel config slots).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from blis_fast.options import OPTIONS_BY_FLAG, Check


@dataclass(frozen=True)
class Param:
    """A parameter of one policy: where a user sets it, its default and checks, and the kernel
    config slot (``"<array>.<kernel constant>"``) its effective value is packed into."""

    key: str  # the policy-bundle key (e.g. ``admission.token_bucket_capacity``)
    kind: type  # int or float
    slot: str
    default: Any = None  # None: the default of ``flag`` in the options table
    flag: str = ""  # a CLI flag setting it (a bundle value applies when the flag is not given)
    bundle_check: Check | None = None  # on a bundle value, whichever policy is selected
    check: Check | None = None  # on the effective value, when this policy is selected
    bundle_default: Any = None  # the default instead when the bundle selects this policy

    def default_value(self) -> Any:
        """The value when neither the bundle nor the flag sets it."""
        return OPTIONS_BY_FLAG[self.flag].default if self.default is None else self.default


@dataclass(frozen=True)
class Policy:
    """One implementation of a policy family, as the kernel knows it (``code``)."""

    name: str
    code: int
    params: tuple[Param, ...] = ()
    reason: str = ""  # decision-trace reason text (a format for routing decisions)
    reason_code: int = -1  # the kernel's code of that reason (admission refusals)
    hook: str = ""  # a user function runs it: the ``Hooks`` attribute it needs


E = TypeVar("E")


class Registry(Generic[E]):
    """The implementations of one family, in registration order.

    ``flag`` is the option choosing one of them (its default in the options table is the
    family's default, also what an empty name means); ``slot`` is the kernel config slot of the
    chosen implementation's code.
    """

    def __init__(self, family: str, flag: str, slot: str = "") -> None:
        self.family = family
        self.flag = flag
        self.slot = slot
        self.entries: dict[str, E] = {}

    def register(self, entry: E) -> E:
        """Add ``entry`` under its name; a second entry of one name is a programming error."""
        name = entry.name  # type: ignore[attr-defined]
        if name in self.entries:
            raise ValueError(f"{self.family}: {name!r} is registered twice")
        self.entries[name] = entry
        return entry

    def __iter__(self) -> Iterator[E]:
        return iter(self.entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __getitem__(self, name: str) -> E:
        """The entry of ``name``; ``""`` is the family's default."""
        return self.entries[name or self.default_name]

    @property
    def default_name(self) -> str:
        """The name the option table gives the family's flag by default."""
        return OPTIONS_BY_FLAG[self.flag].default

    def valid_names(self) -> tuple[str, ...]:
        """The names a user may give (sorted); entries run by a user function excluded."""
        return tuple(sorted(name for name, e in self.entries.items()
                            if not getattr(e, "hook", "")))

    def code(self, name: str) -> int:
        """The kernel code of ``name`` (``""``: the default's)."""
        return self[name].code  # type: ignore[attr-defined]

    def codes(self) -> dict[str, int]:
        """Every name (and ``""``) with its kernel code."""
        return {"": self.code(""), **{name: e.code  # type: ignore[attr-defined]
                                      for name, e in self.entries.items()}}

    def help_names(self) -> str:
        """The valid names for a help text, and the user-function entries if any."""
        text = ", ".join(self.valid_names())
        hooks = [name for name, e in self.entries.items() if getattr(e, "hook", "")]
        if hooks:
            text += "; " + ", ".join(hooks) + " through the Python API"
        return text
