"""The values of ``num_workers="auto"`` and ``prefetch_factor="auto"`` as a loader holds them:
ints that say they are auto."""

from __future__ import annotations

from typing import Any, Optional

from . import measure, policy

AUTO = "auto"


class _AutoInt(int):
    """An ``int`` attribute of an auto loader: code that compares or formats it (torch's
    checks, Lightning's) sees a number, and a loader rebuilt from its attributes is auto
    again."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"

    __str__ = __repr__


class AutoWorkers(_AutoInt):
    """``loader.num_workers`` of a loader built with ``num_workers="auto"``: the usable cores,
    what auto starts for work that keeps them busy."""

    def __new__(cls, cap: Optional[int] = None) -> "AutoWorkers":
        return super().__new__(cls, measure.usable_cores() if cap is None else cap)


class AutoPrefetch(_AutoInt):
    """``loader.prefetch_factor`` of a loader built with ``prefetch_factor="auto"`` and
    ``num_workers="auto"``: where the tuning starts, torch's default 2."""

    def __new__(cls) -> "AutoPrefetch":
        return super().__new__(cls, policy.PREFETCH)


def is_auto(value: Any) -> bool:
    return isinstance(value, _AutoInt) or (isinstance(value, str) and value == AUTO)
