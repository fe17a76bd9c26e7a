"""DESIGN §3: "Retention pruning keeps the newest `keep_terminal` of each (by `updated_at`)
and removes the rest; dead letters are kept until their own limit or an explicit prune."
Before, retention (automatic and `recover`'s) pruned dead letters at `keep_terminal` like
any other finished job. Their own limit: `keep_dead` (default: at least 10,000), both
stores."""

from __future__ import annotations

from pathlib import Path

from jobspool import JobState
from tests.cli_harness import run_cli
from tests.spools import make_spool


def _dead(spool, n: int, prefix: str = "d") -> None:  # type: ignore[no-untyped-def]
    for i in range(n):
        spool.enqueue("k", {}, job_id=f"{prefix}{i}")
        [lease] = spool.claim(kinds="k")
        spool.fail(lease, "broken", retryable=False)


def test_retention_keeps_dead_letters_to_their_own_limit(store_root: str | Path) -> None:
    with make_spool(store_root, keep_terminal=1) as spool:
        _dead(spool, 4)
        for i in range(3):
            spool.enqueue("k", {}, job_id=f"c{i}")
            [lease] = spool.claim(kinds="k")
            spool.complete(lease, None)
        spool.recover()
        assert sorted(j.id for j in spool.jobs(state=JobState.DEAD_LETTER)) == \
            ["d0", "d1", "d2", "d3"]
        assert [j.id for j in spool.jobs(state=JobState.COMPLETED)] == ["c2"]
        assert spool.keep_dead == 10_000


def test_keep_dead_is_a_setting_of_the_spool(store_root: str | Path) -> None:
    with make_spool(store_root, keep_terminal=1, keep_dead=2) as spool:
        _dead(spool, 4)
        spool.recover()
        assert sorted(j.id for j in spool.jobs(state=JobState.DEAD_LETTER)) == ["d2", "d3"]
    with make_spool(store_root) as again:  # saved at creation, the default of later openers
        assert again.keep_dead == 2


def test_an_explicit_prune_still_prunes_dead_letters(store_root: str | Path) -> None:
    with make_spool(store_root, keep_terminal=1) as spool:
        _dead(spool, 3)
        spool.prune(keep=0, keep_dead=1)
        assert [j.id for j in spool.jobs(state=JobState.DEAD_LETTER)] == ["d2"]


def test_init_takes_keep_dead(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    assert run_cli("init", "--keep-terminal", "5", "--keep-dead", "7", root=root).code == 0
    with make_spool(root) as spool:
        assert (spool.keep_terminal, spool.keep_dead) == (5, 7)


def test_a_prune_by_keep_or_age_leaves_dead_letters_to_their_own_limit(
        store_root: str | Path) -> None:
    # `prune --keep 1000` is the README's example: it cut dead letters to 1000 as well, and
    # `--older-than 0` removed every one of them, with keep_dead set at init.
    root = str(store_root)
    assert run_cli("init", "--keep-dead", "100", root=root).code == 0
    with make_spool(root) as spool:
        _dead(spool, 5)
        for i in range(5):
            spool.enqueue("k", {}, job_id=f"c{i}")
            [lease] = spool.claim(kinds="k")
            spool.complete(lease, None)
    for args in (["prune", "--keep", "2"], ["prune", "--older-than", "0"]):
        assert run_cli(*args, root=root).code == 0
    with make_spool(root) as spool:
        assert len(list(spool.jobs(state=JobState.DEAD_LETTER))) == 5
        assert list(spool.jobs(state=JobState.COMPLETED)) == []
        spool.prune(keep=0)  # the API the same way
        assert len(list(spool.jobs(state=JobState.DEAD_LETTER))) == 5
    assert run_cli("prune", "--keep-dead", "1", root=root).code == 0
    with make_spool(root) as spool:
        assert [j.id for j in spool.jobs(state=JobState.DEAD_LETTER)] == ["d4"]
