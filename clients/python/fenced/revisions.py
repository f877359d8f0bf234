"""The order in which fenced issued revisions (docs/design/05-numbering.md §5.1).

Revisions are not ordered by magnitude alone. fenced read Redis's clock in µs
before (15-16 digits, ``1796079180861096``) and reads it in units of 100 µs
now (14 digits, below 10**14, so that a writer formatting one as a Lua number
writes it exactly); every 14-digit revision was issued after every 15-16
digit one. Numbers below 10**13 (older writers counting 1, 2, 3) come before
both. Within each of the three ranges the larger is the later. This mirrors
the Go client's ``CompareRevisions``.
"""

from __future__ import annotations

CLOCK_ERA_MIN = 10**13
"""The smallest revision of the range fenced issues in (14 digits)."""

ISSUE_MAX = 10**14 - 1
"""The largest revision or epoch fenced issues."""


def _era(r: int) -> int:
    if r < CLOCK_ERA_MIN:
        return 0
    if r > ISSUE_MAX:
        return 1
    return 2


def compare_revisions(a: int, b: int) -> int:
    """Compare revisions ``a`` and ``b`` in issue order: -1 when ``a`` was
    issued before ``b``, 0 when equal, 1 when ``a`` was issued after ``b``."""
    ka, kb = (_era(a), a), (_era(b), b)
    return (ka > kb) - (ka < kb)


def later_revision(a: int, b: int) -> int:
    """The later of revisions ``a`` and ``b`` in issue order."""
    return b if compare_revisions(b, a) > 0 else a
