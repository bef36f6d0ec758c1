"""``vramctl validate``'s answer for a valid set as words: :func:`validated_lines`, what
``render.validated`` prints (its first word in green) and what the command line writes
as it is where rich would print plain text (``controller.interfaces.cli.plain``).

Formats only: must not compute anything the manifest set and the core did not, nor
import rich.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controller.manifest import ManifestSet
    from statemachine.domain.types import DesiredState

#: the answer's first word (``render`` prints it in green)
VALID = "valid"


def _as_is(text: str) -> str:
    return text


def validated_lines(
    mset: ManifestSet, desired: DesiredState, quote: Callable[[str], str] = _as_is
) -> list[str]:
    """The lines after :data:`VALID`: the first goes on its line (``valid: ...``), each
    GPU role's budget on its own; the files and role ids through ``quote`` (``render``:
    rich's markup escape)."""
    files = quote(", ".join(str(f) for f in mset.files))
    in_ledger = sum(1 for s in desired.serves.values() if desired.in_ledger(s))
    roles = len(desired.roles)
    head = (
        f": {files}: {len(desired.serves)} serves ({in_ledger} with reservations), "
        f"{roles} gpu {'role' if roles == 1 else 'roles'}"
    )
    return [
        head,
        *(
            f"  {quote(r.id)}: capacity {r.capacity_mib} - reserve {r.reserve_mib} "
            f"= budget {r.budget_mib} MiB"
            for r in desired.roles.values()
        ),
    ]
