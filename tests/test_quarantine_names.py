"""Quarantine names fit the file-name limit in bytes, whatever the stray file's name."""

from __future__ import annotations

import os
from pathlib import Path

from jobspool import Spool


def test_recover_quarantines_a_stray_file_whose_name_is_long_in_bytes(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", create=True, lease_seconds=600)
    spool.enqueue("k", {}, job_id="kept")
    name = "é" * 120 + ".json"  # 245 bytes: a legal name, 125 characters
    (tmp_path / "s" / "ready" / name).write_text("not json")
    report = spool.recover()
    assert not (tmp_path / "s" / "ready" / name).exists()
    quarantined = os.listdir(tmp_path / "s" / "quarantine")
    assert quarantined and all(len(os.fsencode(q)) <= 255 for q in quarantined), quarantined
    assert report.quarantined, report
    assert spool.get("kept").state == "ready"
    spool.close()
