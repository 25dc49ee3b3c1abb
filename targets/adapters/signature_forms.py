"""The form of a function's signature at a pin: which of a named list of historical forms it has.

A function followed through history changes its signature (a framework adds the global normalisers its
strategies compute, or a weights argument). An entry that calls only the newest form is a skip at every older
commit, so a bisection across the change is inconclusive. The entry lists the forms instead, newest first, each
with the parameters it needs; `choose` picks the first one the pin's signature has, and the entry calls that form
and says which in its notes (the report and the reproducer then name it).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Sequence

from maskfuzz.targets.adapters.base import NotPresent


@dataclass(frozen=True)
class Form:
    """One historical signature of a function.

    `name` says what the form is (e.g. "global-normalisers"); `params` the parameter names a pin's signature
    must have for this form to be called; `since` where it appeared (a commit and file:line, for the notes)."""

    name: str
    params: tuple[str, ...]
    since: str = ""

    def note(self, fn: Callable) -> str:
        """One line for the entry's notes: the form, where it appeared, the pin's signature text."""
        where = f" (since {self.since})" if self.since else ""
        return f"signature form {self.name!r}{where}: {getattr(fn, '__name__', 'fn')}{signature_text(fn)}"


def signature_text(fn: Callable) -> str:
    """`(a, b, c=None)`: the signature as the pin spells it ('(?)' when Python cannot read it)."""
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(?)"


def choose(fn: Callable, forms: Sequence[Form], where: str = "") -> Form:
    """The first of `forms` (newest first) whose parameters the signature of `fn` has.

    Raises NotPresent naming every form when none fits (or the signature cannot be read)."""
    try:
        have = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as exc:
        raise NotPresent(f"{where or fn!r}: the signature cannot be read ({exc})") from None
    for form in forms:
        if set(form.params) <= have:
            return form
    known = "; ".join(f"{f.name}: {', '.join(f.params)}" for f in forms)
    raise NotPresent(f"{where or fn!r} has none of the known signature forms ({known}); it takes {sorted(have)}")
