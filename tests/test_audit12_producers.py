"""Audit of issue 12 (producers): what a new user tried and found short, each pinned here.

An `AsyncSpool` handed to a `Worker`; a duplicate under `--on-conflict error` as a
refusal (exit 2); `enqueue_many_results` from async code; the duplicate-policy table,
unique states and retention by age on both stores; schedules refusing a bad `tz`,
`priority` or shape at once, taking the `@daily` family, isolating a refused schedule,
three processes through downtime; the README's examples as written; a refused `run_at`
named as the user gave it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from jobspool import AsyncSpool, Schedule, Spool, Worker
from jobspool.errors import DuplicateJob, InvalidJob, ScheduleError
from tests.cli_harness import run_cli
from tests.helpers_spool import FakeClock
from tests.spools import make_spool

BACKENDS = ["asyncio", "trio"]


def _double(job: Any, ctx: Any) -> int:
    return int(job.payload) * 2


# ---------------------------------------------------------------- async producers


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_takes_an_async_spool_and_drains_what_its_tasks_enqueued(
        tmp_path: Path, backend: str) -> None:
    async def main_() -> list[int]:
        async with AsyncSpool(tmp_path / "spool", durable=False) as spool:
            jobs = await spool.enqueue_many("double", [1, 2, 3])
            worker = Worker(spool, {"double": _double}, maintenance=False)  # type: ignore[arg-type]
            report = await worker.arun_until_idle()
            assert report.completed == 3
            return [await spool.result(j.id, timeout=30) for j in jobs]

    assert anyio.run(main_, backend=backend) == [2, 4, 6]


@pytest.mark.parametrize("backend", BACKENDS)
def test_async_enqueue_many_results_say_which_jobs_were_created(
        tmp_path: Path, backend: str) -> None:
    async def main_() -> list[tuple[str, str, bool]]:
        async with AsyncSpool(tmp_path / "spool", durable=False) as spool:
            await spool.enqueue("k", 0, job_id="taken")
            results = await spool.enqueue_many_results("k", [1, 2], job_ids=["fresh", "taken"])
            return [(r.job.id, r.outcome, r.created) for r in results]

    assert anyio.run(main_, backend=backend) == [
        ("fresh", "created", True), ("taken", "existing", False)]


# ---------------------------------------------------------------- the duplicate policy, CLI


def test_cli_enqueue_says_on_stderr_only_when_it_created_nothing_and_json_is_the_job(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    assert run_cli("init", root=root).code == 0
    calls = [([], False, 1), ([], True, 1), (["--on-conflict", "replace"], False, 2)]
    for extra, noted, payload in calls:
        code, out, err = run_cli("enqueue", "k", json.dumps({"v": payload}), "--id", "j1",
                                 "--json", *extra, root=root)
        assert code == 0
        assert ("already exists" in err) is noted
        shown = run_cli("show", "j1", "--json", root=root)
        assert shown.code == 0
        assert json.loads(out) == json.loads(shown.out)
        assert json.loads(out)["payload"] == {"v": payload}


def test_cli_on_conflict_error_on_a_taken_id_is_refused_with_exit_2_and_one_line(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    assert run_cli("init", root=root).code == 0
    assert run_cli("enqueue", "k", '{"v": 1}', "--id", "j1", root=root).code == 0
    code, _, err = run_cli("enqueue", "k", '{"v": 2}', "--id", "j1", "--on-conflict", "error",
                           root=root)
    assert code == 2
    assert err.startswith("jobspool: error: ") and "'j1'" in err and err.count("\n") == 1
    with make_spool(root) as spool:
        assert spool.get("j1").payload == {"v": 1}
    # An unknown policy is bad input, not a refusal.
    assert run_cli("enqueue", "k", "--on-conflict", "skip", root=root).code == 1


# ---------------------------------------------------------------- the table, on both stores

OLD, NEW = {"v": 1}, {"v": 2}


def _setup(spool: Spool, state: str) -> None:
    if state == "prepared":
        spool.prepare("k", OLD, job_id="d1")
        return
    if state == "pruned":
        _setup(spool, "completed")
        assert spool.prune(keep=0).pruned == ("d1",)
        return
    spool.enqueue("k", OLD, job_id="d1", delay=600 if state == "scheduled" else 0.0)
    if state in ("ready", "scheduled"):
        return
    if state == "canceled":
        spool.cancel("d1")
        return
    (lease,) = spool.claim()
    if state == "retryable":
        spool.fail(lease, "boom", delay=600)
    elif state == "completed":
        spool.complete(lease, {"done": 1})
    elif state == "dead_letter":
        spool.fail(lease, "fatal", retryable=False)


# state before -> per policy: the outcome and the state after ("refused": DuplicateJob).
_TABLE: dict[str, dict[str, tuple[str, str]]] = {
    "prepared": {"keep": ("existing", "prepared"), "replace": ("replaced", "prepared")},
    "ready": {"keep": ("existing", "ready"), "replace": ("replaced", "ready")},
    "scheduled": {"keep": ("existing", "retryable"), "replace": ("replaced", "ready")},
    "retryable": {"keep": ("existing", "retryable"), "replace": ("replaced", "ready")},
    "leased": {"keep": ("existing", "leased"), "replace": ("refused", "leased")},
    "completed": {"keep": ("existing", "completed"), "replace": ("replaced", "ready")},
    "dead_letter": {"keep": ("existing", "dead_letter"), "replace": ("replaced", "ready")},
    "canceled": {"keep": ("reopened", "ready"), "replace": ("replaced", "ready")},
    "pruned": {"keep": ("created", "ready"), "replace": ("created", "ready")},
}


@pytest.mark.parametrize("before", list(_TABLE))
@pytest.mark.parametrize("policy", ["keep", "replace", "error"])
def test_every_store_follows_the_readmes_duplicate_policy_table(
        make_any_spool: Callable[..., Spool], policy: str, before: str) -> None:
    spool = make_any_spool(lease_seconds=30.0)
    _setup(spool, before)
    old = None if before == "pruned" else spool.get("d1")
    outcome, after = (("created", "ready") if before == "pruned" else ("refused", before))  \
        if policy == "error" else _TABLE[before][policy]
    if outcome == "refused":
        with pytest.raises(DuplicateJob) as info:
            spool.enqueue("k", NEW, job_id="d1", on_conflict=policy)
        assert info.value.job_id == "d1"
        assert spool.get("d1") == old  # nothing written
        return
    result = spool.enqueue_result("k", NEW, job_id="d1", on_conflict=policy)
    assert (result.outcome, result.created, result.job.state.value) == (
        outcome, outcome != "existing", after)
    assert spool.get("d1") == result.job
    if outcome == "existing":
        assert result.job == old
    else:
        assert result.job.payload == NEW and result.job.attempts == 0


def test_every_store_keeps_a_job_unique_only_in_the_states_the_caller_names(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(lease_seconds=30.0)
    unique = ("ready", "leased")  # Oban's "unique while ready or running"
    _setup(spool, "completed")
    first = spool.enqueue_result("k", NEW, job_id="d1", unique_states=unique)
    assert (first.outcome, first.job.state.value, first.job.payload) == ("replaced", "ready", NEW)
    again = spool.enqueue_result("k", {"v": 3}, job_id="d1", unique_states=unique)
    assert (again.outcome, again.job.payload) == ("existing", NEW)
    with pytest.raises(DuplicateJob):
        spool.enqueue("k", {"v": 3}, job_id="d1", unique_states=unique, on_conflict="error")
    spool.claim()
    running = spool.enqueue_result("k", {"v": 3}, job_id="d1", unique_states=("ready",))
    assert (running.outcome, running.job.state.value) == ("existing", "leased")


# ---------------------------------------------------------------- retention by age


def _complete(spool: Spool, *ids: str) -> None:
    for job_id in ids:
        spool.enqueue("k", job_id=job_id)
        (lease,) = spool.claim()
        spool.complete(lease, job_id)


def test_every_store_prunes_only_jobs_beyond_the_count_and_older_than_the_age(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(keep_terminal=100)
    _complete(spool, "c1", "c2", "c3")
    assert spool.prune(keep=1, older_than=3600).pruned == ()  # beyond the count, but young
    assert sorted(spool.prune(keep=1, older_than=0).pruned) == ["c1", "c2"]
    assert spool.get("c3").result == "c3"


def test_every_store_keeps_young_results_readable_beyond_keep_terminal(
        make_any_spool: Callable[..., Spool]) -> None:
    spool = make_any_spool(keep_terminal=1, keep_terminal_seconds=3600)
    _complete(spool, "c1", "c2", "c3")
    assert spool.prune().pruned == ()
    assert [spool.get(i).result for i in ("c1", "c2", "c3")] == ["c1", "c2", "c3"]


# ---------------------------------------------------------------- schedules


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"tz": None}, "time zone"),
    ({"tz": 5}, "time zone"),
    ({"priority": "high"}, "priority"),
    ({"priority": 1.5}, "priority"),
    ({"priority": True}, "priority"),
    ({"cron": "@reboot", "every": None}, "@reboot"),
])
def test_a_bad_schedule_field_is_a_schedule_error_when_it_is_built(
        kwargs: dict[str, Any], says: str) -> None:
    options: dict[str, Any] = {"every": 60, **kwargs}
    with pytest.raises(ScheduleError) as info:
        Schedule("tick", **options)
    assert says in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("macro", "expr"), [
    ("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *"), ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
])
def test_cron_macros_tick_like_the_expressions_they_stand_for(macro: str, expr: str) -> None:
    at = datetime(2026, 3, 14, 15, 9, 26, tzinfo=UTC).timestamp()
    short, long = Schedule("tick", cron=macro), Schedule("tick", cron=expr)
    assert short.next_tick(at) == long.next_tick(at)
    assert short.last_tick(at) == long.last_tick(at)
    assert macro in short.describe()


# ---------------------------------------------------------------- time


def test_a_refused_run_at_datetime_is_named_as_an_iso_time(spool: Spool, clock: FakeClock) -> None:
    long_ago = datetime.fromtimestamp(clock.now, UTC) - timedelta(days=30)
    with pytest.raises(InvalidJob) as info:
        spool.enqueue("k", run_at=long_ago)
    assert long_ago.isoformat() in str(info.value) and "datetime.datetime" not in str(info.value)
    assert list(spool.jobs()) == []
    with pytest.raises(InvalidJob) as info:
        spool.enqueue("k", run_at=long_ago + timedelta(days=31), delay=5)
    assert "datetime.datetime" not in str(info.value)


def test_scheduler_is_public_and_the_schedules_command_tells_a_fired_tick_from_a_passed_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobspool import Scheduler

    (tmp_path / "audit12_sched_app.py").write_text(
        "from jobspool import App, Schedule\n"
        "app = App(handlers={'feeds.poll': print, 'reports.daily': print},\n"
        "          schedules=[Schedule('feeds.poll', every=60),\n"
        "                     Schedule('reports.daily', cron='0 3 * * *', tz='Europe/Paris')])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from audit12_sched_app import app  # type: ignore[import-not-found]

    root = tmp_path / "spool"
    now = datetime(2026, 12, 1, 12, 0, 10, tzinfo=UTC).timestamp()  # 3:00 long past
    with make_spool(root) as spool:
        (fired,) = Scheduler(app.schedules).tick(spool, now)
        assert fired.created == (f"sched.feeds.poll.{int(now) - 10}",)
    listed = run_cli("schedules", "--app", "audit12_sched_app:app", "--json", root=root)
    assert listed.code == 0
    rows = {r["name"]: r for r in listed.json()}
    assert rows["feeds.poll"]["last_job_state"] == "ready"
    # First sight at noon passes over today's 3:00 tick without firing it.
    assert rows["reports.daily"]["last_tick_iso"] == "2026-12-01T02:00:00.000Z"
    assert rows["reports.daily"]["last_job_state"] is None
    table = run_cli("schedules", "--app", "audit12_sched_app:app", root=root)
    assert table.code == 0
    header, *lines = table.out.splitlines()
    assert "2026-12-01T02:00:00.000Z (no job)" in lines[1] and "(ready)" in lines[0]
    at = header.index("NEXT TICK")  # every column lines up under its heading
    assert all(line[at:at + 4] == "2026" for line in lines)


# ---------------------------------------------------------------- the README, as written


def _readme_block(heading: str) -> str:
    from tests.subproc import REPO

    text = (REPO / "README.md").read_text()
    section = text[text.index(heading):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("```\n", start)]


def test_the_readmes_async_example_runs_as_written_and_again(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.subproc import cli_env

    (tmp_path / "example.py").write_text(_readme_block("### From async code: `AsyncSpool`"))
    for _ in range(2):  # a second run finds its ids taken and the results still there
        done = subprocess.run([sys.executable, "-W", "error", "example.py"], cwd=tmp_path,
                              env=cli_env(), capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout, done.stderr) == (0, "7\n", "")


def test_the_readmes_periodic_example_builds_an_app_the_schedules_command_lists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "audit12_readme_jobs.py").write_text(_readme_block("### Periodic jobs"))
    monkeypatch.syspath_prepend(str(tmp_path))
    root = tmp_path / "spool"
    assert run_cli("init", root=root).code == 0
    listed = run_cli("schedules", "--app", "audit12_readme_jobs:app", "--json", root=root)
    assert listed.code == 0
    rows = listed.json()
    assert [(r["name"], r["rule"]) for r in rows] == [
        ("reports.daily", "cron '0 3 * * *' (Europe/Paris)"), ("feeds.poll", "every 60 s")]


# ---------------------------------------------------------------- kinds with dots and dashes


def test_dotted_and_dashed_kinds_run_through_the_cli_and_an_unknown_kind_names_the_app(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "audit12_kinds_app.py").write_text(
        "from jobspool import App\n"
        "def add(job, ctx): return sum(job.payload)\n"
        "def index(job, ctx): return job.payload['path']\n"
        "app = App(handlers={'tasks.add': add, 'index-note': index})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    root = tmp_path / "spool"
    assert run_cli("init", root=root).code == 0
    spec = "audit12_kinds_app:app"
    assert run_cli("enqueue", "tasks.add", "[1, 2]", "--id", "a", root=root).code == 0
    assert run_cli("enqueue", "index-note", '{"path": "n.md"}', "--id", "b", root=root).code == 0
    code, _, err = run_cli("run-until-idle", "--app", spec, "--kinds", "tasks.add,nope",
                           root=root)
    assert code == 1
    assert "no handler for: nope" in err
    assert spec in err and err.count("\n") == 1
    ran = run_cli("run-until-idle", "--app", spec, "--kinds", "tasks.add,index-note", "--json",
                  root=root)
    assert ran.code == 0
    assert ran.json()["completed"] == 2
    with make_spool(root) as spool:
        assert (spool.get("a").result, spool.get("b").result) == (3, "n.md")


def test_a_schedule_whose_job_the_spool_refuses_does_not_stop_the_others(
        make_any_spool: Callable[..., Spool], caplog: pytest.LogCaptureFixture) -> None:
    from jobspool import Scheduler

    spool = make_any_spool()
    now = float(Schedule("tick", every=60).last_tick(spool.now()) + 1)  # on time, both stores
    scheduler = Scheduler([Schedule("big", every=60, payload="x" * 70_000),
                           Schedule("tick", every=60)])
    (fired,) = scheduler.tick(spool, now)
    assert fired.schedule == "tick" and len(fired.created) == 1
    assert [j.id for j in spool.jobs()] == list(fired.created)
    assert "schedule big not fired" in caplog.text and "max_job_bytes" in caplog.text
    assert [r["last_tick"] for r in scheduler.status(spool, now)] == [
        None, fired.ticks[0]]  # the refused one keeps its mark: tried again next time


def test_an_app_given_one_schedule_instead_of_a_list_says_so_in_one_line() -> None:
    from jobspool import App

    one = Schedule("k", every=60)
    with pytest.raises(ScheduleError, match=r"must be a list of jobspool\.Schedule"):
        App(handlers={"k": print}, schedules=one)  # type: ignore[arg-type]
    assert App(handlers={"k": print}, schedules=None).schedules == ()  # type: ignore[arg-type]
    assert App(handlers={"k": print}, schedules=(one,)).schedules == (one,)


# ---------------------------------------------------------------- three processes, downtime

_DOWNTIME_PROCESS = """
import json, random, sys, time
from pathlib import Path
from jobspool import Schedule, Scheduler, Spool

root, seed = sys.argv[1], int(sys.argv[2])
go1, go2 = Path(sys.argv[3]), Path(sys.argv[4])
T0, PAUSE, RESUME, END = (int(x) for x in sys.argv[5:9])
scheduler = Scheduler([Schedule(f"tick.{c}", every=60, catch_up=c, grace_seconds=30)
                       for c in ("skip", "once", "all")])
rng = random.Random(seed)
now = [float(T0)]
created = []
with Spool(root, durable=False, clock=lambda: now[0]) as spool:  # the injected clock

    def run(start, end, go):
        print("ready", flush=True)
        while not go.exists():
            time.sleep(0.001)
        now[0] = float(start)
        while True:
            for fired in scheduler.tick(spool):  # at the spool's (injected) clock
                created.extend(fired.created)
            if now[0] >= end:
                return
            now[0] = min(end, now[0] + rng.uniform(1, 25))

    run(T0, PAUSE, go1)
    run(RESUME, END, go2)  # every process was down from PAUSE to RESUME
print(json.dumps(created), flush=True)
"""


@pytest.mark.slow
def test_three_processes_fire_each_tick_once_and_apply_each_catch_up_policy_after_downtime(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.subproc import REPO, cli_env

    aligned = 1_699_999_980  # a minute boundary; the processes start 20 s after it
    t0, pause, resume, end = aligned + 20, aligned + 1200, aligned + 2400 + 45, aligned + 3620
    root, go1, go2 = tmp_path / "spool", tmp_path / "go1", tmp_path / "go2"
    make_spool(root).close()
    args = [str(x) for x in (go1, go2, t0, pause, resume, end)]
    procs = [subprocess.Popen([sys.executable, "-c", _DOWNTIME_PROCESS, str(root), str(seed),
                               *args], cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, text=True)
             for seed in range(3)]
    for go in (go1, go2):  # both phases start together: a barrier on "ready"
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        go.touch()
    created: list[str] = []
    for p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0
        created.extend(json.loads(out.strip().splitlines()[-1]))
    every = [aligned + 60 * k for k in range(61)]  # the ticks from start to end
    missed = [aligned + 60 * k for k in range(21, 41)]  # 21..40: passed while all were down
    expected = {f"sched.tick.all.{t}" for t in every}
    expected |= {f"sched.tick.once.{t}" for t in every if t not in missed[:-1]}  # the latest
    expected |= {f"sched.tick.skip.{t}" for t in every if t not in missed}  # none of them
    # Two independent checks: what the processes say they created, and what is on disk.
    assert sorted(created) == sorted(expected)
    with make_spool(root) as spool:
        on_disk = {j.id: j.revision for j in spool.jobs()}
    assert set(on_disk) == expected and set(on_disk.values()) == {1}


def test_show_names_a_delayed_job_scheduled_first_not_retryable(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    assert run_cli("init", root=root).code == 0
    assert run_cli("enqueue", "k", "--id", "later", "--delay", "3600", root=root).code == 0
    shown = run_cli("show", "later", root=root)
    assert shown.code == 0
    (state,) = [line for line in shown.out.splitlines()
                if line.strip().startswith("state:")]
    assert state.split(":", 1)[1].split()[0] == "scheduled"


@pytest.mark.parametrize("on_conflict", ["error", "replace"])
def test_a_refused_batch_leaves_no_staged_file_behind(tmp_path: Path, on_conflict: str) -> None:
    # Found in a new-user pass: a new id's file, written before the lock, was handed to
    # the publish list; a later id's DuplicateJob then skipped the discard, leaving one
    # full job in tmp/ per refused batch (25 files, 1.2 MB after 20 batches).
    from tests.helpers_spool import tmp_leftovers

    with make_spool(tmp_path / "spool") as spool:
        spool.enqueue("k", 0, job_id="taken")
        if on_conflict == "replace":
            spool.claim()  # a leased job cannot be replaced
        for i in range(5):
            with pytest.raises(DuplicateJob):
                spool.enqueue_many("k", ["x" * 60_000, 1], job_ids=[f"new{i}", "taken"],
                                   on_conflict=on_conflict)
        assert tmp_leftovers(spool.root) == []
        assert [j.id for j in spool.jobs()] == ["taken"]


@pytest.mark.parametrize("job_ids", [{"s1", "s2"}, "gh", (i for i in ("a", "b")), 5])
def test_job_ids_must_be_a_list(tmp_path: Path, job_ids: Any) -> None:
    # Found in a producers pass: a set paired ids with payloads in hash order (a payload
    # stored under another's idempotency key), a str made an id per character, a
    # generator or an int gave a bare TypeError.
    from jobspool.errors import InvalidType

    with make_spool(tmp_path / "spool") as spool:
        with pytest.raises(InvalidType, match="job_ids must be a list"):
            spool.enqueue_many("k", [1, 2], job_ids=job_ids)
        with pytest.raises(InvalidType, match="unique_states must be a list"):
            spool.enqueue_many("k", [1], job_ids=["a"], unique_states=5)  # type: ignore[arg-type]
        assert list(spool.jobs()) == []


def test_replacing_a_prepared_job_checks_its_size_with_its_reservations(tmp_path: Path) -> None:
    # Found in a producers pass: 120 reservations plus a payload near the limit made a
    # 65,768-byte file, "written anyway" (DESIGN §9: an accepted job always fits).
    from jobspool.errors import JobTooLarge

    with make_spool(tmp_path / "spool") as spool:
        for _ in range(120):
            spool.prepare("k", "y", job_id="pp")
        with pytest.raises(JobTooLarge, match="prepared by 120 producer"):
            spool.enqueue("k", "x" * 63_205, job_id="pp", on_conflict="replace")
        assert spool.get("pp").payload == "y"
        assert spool.fsck().ok


def test_the_listing_does_not_show_a_previous_rules_mark_as_the_last_tick(
        make_any_spool: Callable[..., Spool]) -> None:
    """A rule changed under its name: `tick` starts over from the old rule's mark; the
    listing showed that mark as the new rule's last tick (a time that is no tick of it)."""
    from jobspool import Scheduler

    spool = make_any_spool()
    now = float(Schedule("s", every=60).last_tick(spool.now()) + 1)
    Scheduler([Schedule("s", every=60)]).tick(spool, now)
    changed = Scheduler([Schedule("s", cron="0 0 1 1 *")])
    assert [r["last_tick"] for r in changed.status(spool, now)] == [None]
    assert [r["last_tick"] for r in Scheduler([Schedule("s", every=60)]).status(
        spool, now)] != [None]  # the old rule still sees its own mark
