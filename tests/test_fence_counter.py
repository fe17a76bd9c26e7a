"""Fencing tokens from shared memory with a flushed ceiling on disk (issue 14).

Tokens must stay strictly increasing across processes, a SIGKILL, a reboot
(shared memory from before it is discarded) and a deleted `.lock`, while the
`fence` file is rewritten once per block of tokens, not once per claim.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from jobspool.queue.fence import BLOCK, decode_fence
from tests.spools import make_spool
from tests.subproc import REPO, cli_env


def _disk_fence(root: Path) -> int:
    return decode_fence((root / "fence").read_bytes())


def test_claims_rewrite_the_fence_file_once_per_block_not_once_per_claim(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as s:
        s.enqueue_many("k", list(range(200)))
        first = s.claim()[0].token
        ceiling = _disk_fence(root)
        inode = (root / "fence").stat().st_ino
        tokens = [s.claim()[0].token for _ in range(150)]
        assert tokens == list(range(first + 1, first + 151))
        assert _disk_fence(root) == ceiling >= max(tokens)  # no rewrite within the block
        assert (root / "fence").stat().st_ino == inode


def test_a_claim_past_the_ceiling_flushes_a_new_one_before_handing_out_its_tokens(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as s:
        s.enqueue_many("k", list(range(BLOCK + 10)))
        leases = s.claim(limit=BLOCK + 5)
        assert _disk_fence(root) >= max(lease.token for lease in leases)
        assert s.fence_value() == max(lease.token for lease in leases)


def test_tokens_keep_increasing_after_a_simulated_reboot(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as s:
        s.enqueue_many("k", list(range(10)))
        before = [lease.token for lease in s.claim(limit=5)]
        # A reboot: the map's content is from another boot (what the lock sees first).
        s.lock.put(s.lock.BOOT_SLOT, 12345)
        s.lock.put(s.lock.FENCE_NEXT_SLOT, 0)
        after = [lease.token for lease in s.claim(limit=5)]
        assert min(after) > max(before)
        assert s.lock.suspect()  # two copies of a job may exist until recovery runs
        assert _disk_fence(root) >= max(after)


def test_tokens_keep_increasing_after_the_lock_file_is_deleted(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as s:
        s.enqueue_many("k", list(range(10)))
        before = [lease.token for lease in s.claim(limit=5)]
        (root / ".lock").unlink()
    with make_spool(root) as s2:
        after = [lease.token for lease in s2.claim(limit=5)]
    assert min(after) > max(before)


def test_tokens_keep_increasing_after_a_claimer_is_sigkilled(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as s:
        s.enqueue_many("k", list(range(5000)))
    code = textwrap.dedent("""
        import sys
        from jobspool import Spool
        s = Spool(sys.argv[1], durable=False)
        while True:
            for lease in s.claim(limit=3):
                print(lease.token, flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE,
                             text=True, cwd=REPO, env=cli_env())
    assert child.stdout is not None
    seen = [int(child.stdout.readline()) for _ in range(300)]
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    seen += [int(line) for line in child.stdout.read().split()]
    child.stdout.close()
    with make_spool(root) as s:
        on_disk = [j.lease.token for j in s.jobs(state="leased") if j.lease is not None]
        nxt = s.claim()[0].token
    assert seen == sorted(set(seen))  # strictly increasing within the child
    assert nxt > max(seen) and nxt > max(on_disk)
    assert _disk_fence(root) >= max(on_disk)


def test_a_counter_set_back_under_a_live_spool_does_not_hand_its_tokens_out_again(
        tmp_path: Path) -> None:
    """A backup of `.lock` and `fence` restored over a spool in use sets the shared counter
    back; the process that handed tokens out goes on above them (it reissued 52..732)."""
    root = tmp_path / "spool"
    with make_spool(root) as s:
        s.enqueue_many("k", list(range(2 * BLOCK)))
        early = s.claim(limit=3)[-1].token
        before = [lease.token for lease in s.claim(limit=BLOCK + 5)]
        # The restore: the shared counter and its cached ceiling back to the early values,
        # the file too.
        s.lock.put(s.lock.FENCE_NEXT_SLOT, early)
        s.lock.put(s.lock.FENCE_CEILING_SLOT, early + 10)
        (root / "fence").write_bytes(b'{"v":1,"fence":%d}' % (early + 10))
        after = [lease.token for lease in s.claim(limit=20)]
        assert min(after) > max(before)
        assert _disk_fence(root) >= max(after)


def test_a_fence_file_an_older_release_advanced_is_taken_in(tmp_path: Path) -> None:
    # Releases before the shared-memory counter hand tokens out from the file itself,
    # writing each one there (a new file per claim). Alternating with one, this counter
    # went on from its cached ceiling: 3 after the old release's 1027, and 1027 would be
    # handed out a second time; the projection dropped the new run's writes.
    from jobspool.queue.fence import encode_fence

    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue_many("k", [{}] * 3)
        first = spool.claim()[0].token
        old_release_token = _disk_fence(root) + 1  # what the old code hands out next
        tmp = root / "fence.old-release"
        tmp.write_bytes(encode_fence(old_release_token))
        os.replace(tmp, root / "fence")  # as it wrote it, after its claim
        second = spool.claim()[0].token
        assert second > old_release_token > first
        third = spool.claim()[0].token
        assert third == second + 1  # no block wasted when nothing changed on disk
        assert _disk_fence(root) >= third


def test_a_damaged_fence_file_under_a_live_spool_does_not_stop_claims(tmp_path: Path) -> None:
    # Every claim stat's the fence file: emptied, it made every claim in every process
    # fail ("fence file is not JSON"); a chmod (ctime) jumped tokens to the ceiling.
    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue_many("k", [{}] * 4)
        first = spool.claim()[0].token
        os.chmod(root / "fence", 0o600)
        second = spool.claim()[0].token
        assert second == first + 1
        (root / "fence").write_bytes(b"")
        third = spool.claim()[0].token
        assert third == second + 1


def test_reading_a_new_spool_writes_no_fence_block(tmp_path: Path) -> None:
    # stats() (and fence_value) reserved the first block of a new spool: a write, so a
    # full disk refused `stats` with WriteFailed. The first claim reserves it now.
    root = tmp_path / "spool"
    make_spool(root).close()
    before = (root / "fence").read_bytes()
    with make_spool(root) as s:
        assert s.stats().counts["ready"] == 0
        assert s.fence_value() == 0
        assert (root / "fence").read_bytes() == before
        s.enqueue("k", {})
        (lease,) = s.claim()
        assert lease.token > 0 and _disk_fence(root) >= lease.token
        assert s.fence_value() == lease.token


def test_reading_after_a_reboot_gives_no_token_below_those_handed_out(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    with make_spool(root) as s:
        s.enqueue_many("k", list(range(3)))
        before = max(lease.token for lease in s.claim(limit=3))
        s.lock.put(s.lock.BOOT_SLOT, 12345)  # a reboot, as in the test above
        s.lock.put(s.lock.FENCE_NEXT_SLOT, 0)
        assert s.fence_value() >= before


def test_a_garbled_fence_file_is_a_health_reason_and_recover_names_it(tmp_path: Path) -> None:
    # Found by a README probe: `health` and `stats` (and `stats --prometheus`) failed whole
    # with the file's error, where the README promises health's `fence_unreadable`; and
    # `recover` moved the file to quarantine/ but reported nothing quarantined.
    import orjson

    from tests.cli_harness import run_cli

    root = tmp_path / "s"
    with make_spool(root) as spool:
        spool.enqueue("k", 1)
    (root / "fence").write_bytes(b"garbage")
    health = run_cli("health", "--json", root=root)
    assert health.code == 2
    doc = orjson.loads(health.out)
    assert doc["status"] != "ok"
    assert "fence_unreadable" in [r["code"] for r in doc["reasons"]]
    stats = run_cli("stats", "--json", root=root)
    assert stats.code == 0, stats.err
    assert orjson.loads(stats.out)["counts"]["ready"] == 1
    recovered = run_cli("recover", "--json", root=root)
    assert recovered.code == 0, recovered.err
    assert orjson.loads(recovered.out)["quarantined"] == ["fence"]
    assert decode_fence((root / "fence").read_bytes()) > 0
