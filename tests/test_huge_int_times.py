"""Integers past any float in time arguments: one line naming the argument, cut short,
never a raw OverflowError (`run_at=10**400`, `Schedule(every=10**400)`), on both
stores (run_at is checked before the store is reached)."""

from __future__ import annotations

import pytest

from jobspool import Schedule
from jobspool.errors import InvalidJob, ScheduleError
from tests.spools import SpoolFactory


@pytest.mark.parametrize("value, said", [(10**400, "past the year 9999"),
                                         (-10**400, "in the past")],
                         ids=["huge", "huge-negative"])
def test_run_at_as_a_huge_int_is_refused_in_one_short_line(make_spool: SpoolFactory,
                                                           value: int, said: str) -> None:
    spool = make_spool()
    with pytest.raises(InvalidJob, match=said) as caught:
        spool.enqueue("k", 1, run_at=value)
    assert len(str(caught.value)) < 200
    assert spool.stats().total == 0


@pytest.mark.parametrize("value", [10**400, -10**400], ids=["huge", "huge-negative"])
def test_every_as_a_huge_int_is_refused_in_one_short_line(value: int) -> None:
    with pytest.raises(ScheduleError, match="every must be a whole number") as caught:
        Schedule("k", every=value)
    assert len(str(caught.value)) < 200
