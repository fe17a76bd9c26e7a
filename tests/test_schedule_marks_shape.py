"""`<root>/schedules.json` holding valid JSON of the wrong shape is reported, once.

Found in a schedules probe: broken JSON got a warning, but `[]` or `{"f1": -5}` (a hand
edit, another tool's file) were dropped without a word, and a `catch_up="all"` schedule
silently lost the ticks it had missed.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from jobspool.queue.marks import MARKS_FILE, read_marks, write_marks


@pytest.mark.parametrize("content", [b"[]", b'{"f1": -5}', b'{"last_tick": {"a": "x"}}',
                                     b'{"last_tick": 7}'],
                         ids=["list", "no-last-tick", "string-tick", "tick-not-object"])
def test_a_marks_file_of_the_wrong_shape_is_warned_about_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes) -> None:
    (tmp_path / MARKS_FILE).write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="jobspool.schedules"):
        assert read_marks(tmp_path) == {}
        assert read_marks(tmp_path) == {}
    said = [r.getMessage() for r in caplog.records if "schedules.json" in r.getMessage()]
    assert len(said) == 1, said
    assert "start afresh" in said[0] and "\n" not in said[0]


def test_a_good_marks_file_is_read_without_a_word(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    write_marks(tmp_path, {"nightly": 1_700_000_000, "nightly#rule": 42}, durable=False,
                mode=0o600)
    with caplog.at_level(logging.WARNING, logger="jobspool.schedules"):
        assert read_marks(tmp_path) == {"nightly": 1_700_000_000}
        assert read_marks(tmp_path, rules=True) == {"nightly": 1_700_000_000,
                                                    "nightly#rule": 42}
        (tmp_path / MARKS_FILE).write_bytes(b'{"v": 1, "last_tick": {}}')
        assert read_marks(tmp_path) == {}
    assert not caplog.records
