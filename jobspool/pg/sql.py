"""The statements of the hot path: each one round trip, each guarded where it writes.

`{now}` is the database's clock (`now()`: the statement's transaction start),
unless the spool was given its own clock, whose reading is then passed as
`%(now)s`. Lease expiry is always judged by that one clock, so hosts whose
clocks disagree cannot take each other's live leases.
"""

from __future__ import annotations

import functools

from jobspool.pg.rows import J_COLUMNS
from jobspool.queue.job import COUNT_TOP, KIND_PATTERN, KIND_RE
from jobspool.queue.payload import MAX_RUN_AT

NOW = "COALESCE(%(now)s::float8, extract(epoch from now()))"

# Fresh jobs of one kind (the common enqueue): one statement and one NOTIFY per batch.
# Generated ids are new, so the fast form is a plain INSERT: `ON CONFLICT DO NOTHING` is a
# speculative insertion (the statement alone, one job per call: 466 → 432 µs in one
# loaded run; a whole `enqueue` A/B, 12 interleaved rounds: 1.01×). Only a statement sent again
# after its reply was lost meets its own rows; the caller then runs the `_SAFE` form, which
# leaves rows already there alone (the statement is atomic: the first try wrote all or none).
_INSERT_FRESH = """
WITH ins AS (
  INSERT INTO jobspool_jobs (id, kind, state, priority, attempts, max_attempts, revision,
                             created_at, updated_at, run_at, payload, timeout)
  SELECT u.id, %(kind)s, u.state, %(priority)s, 0, %(max_attempts)s, 1,
         %(created)s, %(created)s, u.run_at, u.payload::json, %(timeout)s
  FROM unnest(%(ids)b::text[], %(states)b::text[], %(run_ats)b::float8[],
              %(payloads)b::text[]) AS u(id, state, run_at, payload)
  {conflict}
  RETURNING id)
SELECT coalesce(array_agg(id), '{{}}'::text[]), pg_notify(%(channel)s, '') FROM ins
"""
INSERT_FRESH = _INSERT_FRESH.format(conflict="")
INSERT_FRESH_SAFE = _INSERT_FRESH.format(conflict="ON CONFLICT (id) DO NOTHING")

# The same for one job (the common one-per-call enqueue): a plain VALUES row, which the
# server plans and runs cheaper than unpacking arrays, and the NOTIFY in RETURNING (sent
# only when the row was inserted), without a CTE and an aggregate around it.
_INSERT_ONE = """
INSERT INTO jobspool_jobs (id, kind, state, priority, attempts, max_attempts, revision,
                           created_at, updated_at, run_at, payload, timeout)
VALUES (%(id)s, %(kind)s, %(state)s, %(priority)s, 0, %(max_attempts)s, 1,
        %(created)s, %(created)s, %(run_at)s, %(payload)s::json, %(timeout)s)
{conflict}
RETURNING id, pg_notify(%(channel)s, '')
"""
INSERT_ONE = _INSERT_ONE.format(conflict="")
INSERT_ONE_SAFE = _INSERT_ONE.format(conflict="ON CONFLICT (id) DO NOTHING")

# Charging an expired lease (a claim taking it over, or the sweep). As a rule its run is
# charged: the attempt stays counted and a rescue is added (the poison-pill count). The
# exception is the file spool's "batch mates go back uncounted": a Worker runs a rescued
# job alone and records its start before calling its handler (`note_running`), claiming
# with `started = false`; so an expired lease of a rescued job whose start was never
# recorded (`rescues > 0 AND started IS FALSE`) never ran, and gives its attempt back
# without a rescue. Leases claimed by anyone else carry `started = NULL`: always charged,
# so a caller that never records starts cannot loop a poison pill forever.
def _uncounted(p: str = "") -> str:
    return f"({p}rescues > 0 AND {p}started IS FALSE)"


def _eff_attempts(p: str = "") -> str:
    return f"({p}attempts - CASE WHEN {_uncounted(p)} THEN 1 ELSE 0 END)"


def _new_rescues(p: str = "") -> str:
    return f"({p}rescues + CASE WHEN {_uncounted(p)} THEN 0 ELSE 1 END)"


def _past_rescues(p: str, limit: str) -> str:
    """`_new_rescues(p) > limit`, written so that it cannot overflow (see `_bumped`)."""
    return f"({p}rescues > {limit} - CASE WHEN {_uncounted(p)} THEN 0 ELSE 1 END)"


# A count a hand edit set at or near the bigint top (9223372036854775807) overflowed the
# claim's `+ 1`: the statement failed, and with it every claim of every worker, for as long
# as the row was due. Past 2**62 a count is unreadable anyway (`job.implausible`): it is
# kept as it is, so the claim takes it and dead-letters it alone.
def _bumped(expr: str, column: str) -> str:
    return f"(CASE WHEN {column} >= {COUNT_TOP} THEN {column} ELSE {expr} END)"


# Due jobs in claim order (priority, then run_at, then id), skipping rows another
# claimer holds: waiting ones (ready whatever its run_at, as the file spool's `is_due`
# says: a producer whose estimate of the database's clock ran ahead, or a database clock
# stepped back, stamped a ready job's run_at in the database's future, and no claim took
# it until then; retryable past run_at) and, as on the file spool,
# expired leases of a dead or stalled worker (taken over: attempt and rescue counted)
# unless out of attempts or rescues (those the sweep dead-letters). Each source is an
# index scan in claim order, locked as it is read; the top `limit` of both are taken.
# Tokens come from the sequence in claim order: strictly increasing along the batch.
# Each row also says whether an expired lease of the claim's kinds is out of attempts or
# rescues, which the claim leaves to the sweep (the file spool's claim dead-letters those
# itself): the caller then sweeps (a scan of the leased rows, stopped at the first).
# A lease is never handed out already expired, however short: at least a microsecond
# (an epoch in float8 resolves ~0.2 µs).
# The kind filter is written into the text (`kind_filter`), so each plans on its own index.
# `exclude` (the jobs a Worker holds, 100-200 ids) as `NOT IN (SELECT unnest(...))`: the
# server hashes the array once. As `NOT (id = ANY(array))` each row the scan met was
# compared with every id: a batched claim + complete at 0.93x of no exclude, against
# 0.99x now (bench/pg_exclude.py).
# An expired lease out of attempts or rescues: the sweep dead-letters it, the claim skips it.
# Kept out of the claim's scan of expired leases itself: counted in its LIMIT, such leases
# ahead in claim order pushed due ones out (a claim of 1 came back empty, or took a later
# job over an expired lease of higher priority behind them).
_EXHAUSTED = (f"({_eff_attempts()} >= max_attempts OR (%(max_rescues)s::bigint IS NOT NULL "
              f"AND {_past_rescues('', '%(max_rescues)s::bigint')}))")
# Expired leases a claim takes over, and whether one out of attempts or rescues waits for
# the sweep; `take_over=False` (a Worker's claims between take-overs, `claim_sql`) leaves
# both out.
_LAPSED = f"""lapsed AS MATERIALIZED (
  SELECT id, priority, run_at FROM jobspool_jobs
  WHERE state = 'leased' AND expires_at <= {NOW} AND NOT {_EXHAUSTED}
    {{kinds}}
    AND id NOT IN (SELECT unnest(%(exclude)b::text[]))
  ORDER BY priority, run_at, id
  LIMIT {{limit}}
  FOR UPDATE SKIP LOCKED),
"""
_EXHAUSTED_ANY = f"""EXISTS (
  SELECT 1 FROM jobspool_jobs WHERE state = 'leased' AND expires_at <= {NOW} AND {_EXHAUSTED}
    {{kinds}})"""
_NONE_LAPSED = ("lapsed AS (SELECT NULL::text AS id, 0::bigint AS priority, "
                "0::float8 AS run_at WHERE false),\n")

_CLAIM = f"""
WITH due AS MATERIALIZED (
  SELECT id, priority, run_at FROM jobspool_jobs
  WHERE state IN ('ready', 'retryable') AND (state = 'ready' OR run_at <= {NOW})
    {{kinds}}
    AND id NOT IN (SELECT unnest(%(exclude)b::text[]))
  ORDER BY priority, run_at, id
  LIMIT {{limit}}
  FOR UPDATE SKIP LOCKED),
{{lapsed}}c AS MATERIALIZED (
  SELECT s.id, nextval('jobspool_fence') AS token FROM (
    SELECT id, priority, run_at FROM due
    UNION ALL SELECT id, priority, run_at FROM lapsed
    ORDER BY priority, run_at, id LIMIT {{limit}}) s)
UPDATE jobspool_jobs j
SET state = 'leased', revision = {_bumped('j.revision + 1', 'j.revision')},
    attempts = CASE WHEN j.attempts < 0 OR j.attempts >= {COUNT_TOP}
                      THEN j.attempts  -- a hand edit: judged as it is
                    WHEN j.state = 'leased' THEN {_eff_attempts('j.')} + 1
                    ELSE j.attempts + 1 END,
    rescues = CASE WHEN j.state = 'leased' THEN {_bumped(_new_rescues('j.'), 'j.rescues')}
                   ELSE j.rescues END,
    updated_at = {NOW}, token = c.token, owner = %(owner)s,
    expires_at = {NOW} + greatest(%(lease)s::float8, 1e-6), proc = %(proc)s,
    started = %(started)s::boolean
FROM c WHERE j.id = c.id
RETURNING {J_COLUMNS}, {{exhausted}} AS exhausted
"""

# Claimed rows that cannot be read as jobs (leasing.py `_readable`), to dead_letter with
# the reason, each only while the claim's lease on it holds.
DEAD_LETTER_UNREADABLE = f"""
UPDATE jobspool_jobs j
SET state = 'dead_letter', last_error = u.why, revision = {_bumped('j.revision + 1', 'j.revision')},
    updated_at = {NOW},
    token = NULL, owner = NULL, expires_at = NULL, proc = NULL, started = NULL
FROM json_to_recordset(%(rows)s::json) AS u(id text, token bigint, why text)
WHERE j.id = u.id AND j.token = u.token AND j.state = 'leased'
"""

# A claim's own leases, by the mark it gave them (`proc`, unique per claim call): what a
# claim sent again after a lost connection adopts if its first try committed.
ADOPT_CLAIM = f"""
SELECT {J_COLUMNS} FROM jobspool_jobs j WHERE j.state = 'leased' AND j.proc = %(proc)s
"""

def kind_filter(kinds: list[str] | None) -> str:
    """The claim's and sweep's kind filter, the kinds written in as literals.

    Bound as a parameter, the generic plan (every pooled connection plans prepared
    statements generically, pool.py) cannot tell a rare kind from a common one: a claim
    for two rare kinds behind 200,000 due jobs of a third walked the claim-order index
    through all of them, 45-85 ms a claim. Written in, the plan knows the kinds, and
    their statistics: the same claim took 0.4 ms on jobspool_jobs_due_kind. Each set of
    kinds is its own prepared statement; a worker claims with one set. Kinds match
    `KIND_RE` (no quote, no backslash), checked again here since the text is SQL.
    """
    if kinds is None:
        return ""
    # As plain str: a StrEnum member (a str subclass the spool accepts) formats as its
    # name in an f-string, and its repr is no literal.
    if not all(isinstance(k, str) for k in kinds):
        raise ValueError(f"kinds must be str, got {kinds!r}")
    names = sorted({str.__str__(k) for k in kinds})
    for k in names:
        if KIND_RE.fullmatch(k) is None:
            raise ValueError(f"kind {k!r} must match {KIND_PATTERN}")
    if len(names) == 1:
        return f"AND kind = '{names[0]}'"
    return "AND kind IN (" + ", ".join(f"'{k}'" for k in names) + ")"


def claim_sql(kinds: list[str] | None, limit: int, *, take_over: bool = True) -> str:
    """The claim statement for no kind filter or the given kinds (not for none: the
    caller claims nothing then, as the file spool does), taking at most `limit` jobs;
    without `take_over`, due jobs only (no scan of the leased rows)."""
    if kinds is not None and not kinds:
        raise ValueError("claim_sql: an empty kinds list claims nothing")
    if limit < 1:
        raise ValueError(f"claim_sql: limit must be at least 1, got {limit!r}")
    # int(): the text must hold digits, whatever int subclass the caller passed
    return _claim_text(kind_filter(kinds), int(limit), take_over)


# The limit is written into the text, not bound: bound, the server cannot tell a plan for
# 50 rows from one for 10% of the table, so it costed the generic plan of a prepared claim
# above the custom ones and planned every claim afresh (~0.5-0.9 ms of a 2 ms claim of
# 50). Written in, after five custom plans it keeps the generic one. A worker claims with
# one or two limits; each text is its own prepared statement (psycopg keeps the 100 most
# recent per connection).
@functools.lru_cache(maxsize=256)
def _claim_text(kinds: str, limit: int, take_over: bool) -> str:
    text = _CLAIM.replace("{lapsed}", _LAPSED if take_over else _NONE_LAPSED)
    text = text.replace("{exhausted}", _EXHAUSTED_ANY if take_over else "false")
    return text.replace("{kinds}", kinds).replace("{limit}", str(limit))


# Expired leases back to retryable, due after the spool's backoff for the attempts made
# (as the file spool's `machine.reclaim`: a job that crashed its worker does not run again
# at once), or dead_letter (its run_at kept) when out of attempts or rescues (the
# poison-pill cap): all of them (`recover`), or only the exhausted ones of the kinds a
# claim asks for (`sweep_sql`: the rest a claim takes over itself). The token is cleared:
# only a settle keeps it, so a settle sent again after a lost reply can tell its own work
# from a sweep's. Rows locked by a `fenced` block are skipped: their holder is extending
# the lease right now.
SWEEP = f"""
WITH x AS MATERIALIZED (
  SELECT id,
         ({_eff_attempts()} >= max_attempts OR (%(max_rescues)s::int IS NOT NULL
          AND {_past_rescues('', '%(max_rescues)s::int')})) AS dead,
         least(%(retry_max)s::float8, %(retry_base)s::float8
               * 2.0 ^ least(greatest({_eff_attempts()}, 1) - 1, 62)) AS backoff
  FROM jobspool_jobs
  WHERE state = 'leased' AND expires_at <= {NOW}
  {{only}}
  FOR UPDATE SKIP LOCKED)
UPDATE jobspool_jobs j
SET state = CASE WHEN x.dead THEN 'dead_letter' ELSE 'retryable' END,
    last_error = left(CASE
      WHEN {_eff_attempts('j.')} >= j.max_attempts THEN
        'attempts exhausted; last: lease expired (worker died or stalled)'
        || coalesce('; before it: ' || j.last_error, '')
      WHEN %(max_rescues)s::int IS NOT NULL AND {_past_rescues('j.', '%(max_rescues)s::int')} THEN
        'poison pill: lease expired ' || {_bumped(_new_rescues('j.'), 'j.rescues')}
          || ' times (max_rescues=' || %(max_rescues)s::int || ')'
      WHEN {_uncounted('j.')} THEN j.last_error
      ELSE 'lease expired (worker died or stalled)' END, 1024),
    attempts = {_eff_attempts('j.')}, rescues = {_bumped(_new_rescues('j.'), 'j.rescues')},
    revision = {_bumped('j.revision + 1', 'j.revision')}, updated_at = {NOW},
    run_at = CASE WHEN x.dead THEN j.run_at
                  ELSE least({NOW} + x.backoff / 2 + random() * x.backoff / 2,
                             {MAX_RUN_AT}) END,
    token = NULL, owner = NULL, expires_at = NULL, proc = NULL, started = NULL
FROM x WHERE j.id = x.id
RETURNING j.id, j.state
"""

_EXHAUSTED = (f"AND ({_eff_attempts()} >= max_attempts OR (%(max_rescues)s::int IS NOT NULL "
              f"AND {_past_rescues('', '%(max_rescues)s::int')}))")


def sweep_sql(kinds: list[str] | None, *, exhausted_only: bool) -> str:
    """The sweep for every expired lease, or for the exhausted ones of `kinds`."""
    if not exhausted_only:
        return SWEEP.replace("{only}", "")
    only = _EXHAUSTED + " " + kind_filter(kinds)
    return SWEEP.replace("{only}", only)


# Arrays go in binary (`%(x)b`): as text, psycopg quotes every element through a regex,
# ~5% of a raw claim + complete (bench/pg_jobspool raw_consume, two runs each way).

# Complete, fail and release, many at once: each row written only while its lease is
# current (same token, still leased, unexpired) and for the job it was issued on (the same
# creation time: tokens are unique per store only, and two stores' leases on jobs of one id
# can carry the same token, as the file store checks it too). A row left out was refused. Only what the
# database decides comes back (revision, clock, run_at): the caller built the rest of the
# settled job already, and reading the payload back cost a parse per job.
SETTLE = f"""
UPDATE jobspool_jobs j
SET state = u.state, attempts = u.attempts, rescues = u.rescues, revision = j.revision + 1,
    updated_at = {NOW}, run_at = CASE WHEN u.delay IS NULL THEN j.run_at ELSE {NOW} + u.delay END,
    owner = NULL, expires_at = NULL, proc = NULL, max_attempts = u.max_attempts,
    result = u.result::json, last_error = u.last_error, traceback = u.traceback
FROM unnest(%(ids)b::text[], %(tokens)b::int8[], %(created)b::float8[], %(states)b::text[],
            %(attempts)b::int8[], %(rescues)b::int8[], %(delays)b::float8[],
            %(results)b::text[], %(errors)b::text[], %(tracebacks)b::text[],
            %(max_attempts)b::int8[])
     AS u(id, token, created, state, attempts, rescues, delay, result, last_error, traceback,
          max_attempts)
WHERE j.id = u.id AND j.token = u.token AND j.created_at = u.created AND j.state = 'leased'
  AND j.expires_at > {NOW}
RETURNING j.id, j.revision, j.updated_at, j.run_at
"""

# Plain completions (most settles): the batch as one JSON array of {id, token, result},
# unpacked by the server, instead of nine arrays each dumped element by element by the
# driver; only what a completion changes is written. A result holding NUL goes through
# SETTLE (the JSON functions refuse `\u0000` in a `json` value).
SETTLE_COMPLETE = f"""
UPDATE jobspool_jobs j
SET state = 'completed', revision = j.revision + 1, updated_at = {NOW},
    owner = NULL, expires_at = NULL, proc = NULL, result = u.result
FROM json_to_recordset(%(batch)s::json) AS u(id text, token int8, created float8, result json)
WHERE j.id = u.id AND j.token = u.token AND j.created_at = u.created AND j.state = 'leased'
  AND j.expires_at > {NOW}
RETURNING j.id, j.revision, j.updated_at, j.run_at
"""

# Heartbeats: only `expires_at` and `revision` change, neither indexed: a HOT update.
# A row another transaction holds (a `fenced` block, which extends the lease itself when
# it ends) is skipped rather than waited for: one long block must not stall the beat of
# every other lease in the batch.
HEARTBEAT = f"""
WITH x AS MATERIALIZED (
  SELECT j.id, u.secs FROM jobspool_jobs j
  JOIN unnest(%(ids)b::text[], %(tokens)b::int8[], %(created)b::float8[],
              %(leases)b::float8[]) AS u(id, token, created, secs)
    ON j.id = u.id
  WHERE j.token = u.token AND j.created_at = u.created AND j.state = 'leased'
    AND j.expires_at > {NOW}
  FOR UPDATE OF j SKIP LOCKED)
UPDATE jobspool_jobs j
SET expires_at = greatest(j.expires_at, {NOW} + x.secs), revision = j.revision + 1
FROM x WHERE j.id = x.id
RETURNING {J_COLUMNS}
"""
# The same, waiting for the row locks (in id order), for rows the first skipped that no
# `fenced` block of this process holds: an enqueue of the same id, a cancel, a commit
# hold theirs for a statement or two. Skipped, the heartbeat returned the job unextended
# as if it had been (1,419 of 2,000 beats beside two producers re-enqueueing the id).
HEARTBEAT_WAITING = HEARTBEAT.replace(
    "  FOR UPDATE OF j SKIP LOCKED)", "  ORDER BY j.id\n  FOR UPDATE OF j)")
assert HEARTBEAT_WAITING != HEARTBEAT

# Leases still current, read only (a worker checking before it publishes side effects).
CHECK = f"""
SELECT {J_COLUMNS} FROM jobspool_jobs j
JOIN unnest(%(ids)s::text[], %(tokens)s::int8[], %(created)s::float8[]) AS u(id, token, created)
  ON j.id = u.id
WHERE j.token = u.token AND j.created_at = u.created AND j.state = 'leased'
  AND j.expires_at > {NOW}
"""

# Jobs waiting to be claimed per kind (`backlog.py`): counted, no row read out, the
# partial claim index bounds the scan to the waiting states.
WAITING = f"""
SELECT kind, count(*) FILTER (WHERE state = 'ready' OR run_at <= {NOW}),
       count(*) FILTER (WHERE state = 'retryable' AND run_at > {NOW}),
       min(run_at) FILTER (WHERE state = 'retryable' AND run_at > {NOW}), {NOW}
FROM jobspool_jobs WHERE state IN ('ready', 'retryable') GROUP BY kind
"""

# When the next job not yet due becomes claimable (a retry, a scheduled job, an expiring
# lease), as the file spool answers: jobs due already do not count (they made an idle
# worker claim again at once, in a loop, when a claim could not take them).
#
# No index holds the waiting jobs in `run_at` order (one would cost every enqueue), and
# `min(run_at)` over jobspool_jobs_due, ordered by priority first, read every waiting
# row: 100 ms behind 200,000 due jobs, on every idle wakeup of a worker (each NOTIFY of
# an enqueue of any kind). Within one (kind, priority) jobspool_jobs_due_kind *is* in
# `run_at` order, so: walk the distinct (kind, priority) pairs (a skip scan, two index
# probes a pair) and take the first `run_at` past now in each (one probe): 0.2 ms there.
# Past `_PAIRS` pairs (priorities used as a sort key, one per job), the plain scan;
# a CASE evaluates only the branch it takes. A ready job is due whatever its run_at.
_PAIRS = 256
_NEXT_DUE = f"""
WITH RECURSIVE p AS (
  (SELECT kind, priority, 1 AS n FROM jobspool_jobs
   WHERE state IN ('ready', 'retryable') {{kinds}}
   ORDER BY kind, priority LIMIT 1)
  UNION ALL
  SELECT x.kind, x.priority, p.n + 1 FROM p, LATERAL (
    (SELECT kind, priority FROM jobspool_jobs WHERE state IN ('ready', 'retryable')
       AND kind = p.kind AND priority > p.priority ORDER BY priority LIMIT 1)
    UNION ALL
    (SELECT kind, priority FROM jobspool_jobs WHERE state IN ('ready', 'retryable')
       AND kind > p.kind {{kinds}} ORDER BY kind, priority LIMIT 1)
    LIMIT 1) x
  WHERE p.n < {_PAIRS})
SELECT least(
  CASE WHEN (SELECT count(*) FROM p) < {_PAIRS} THEN
    (SELECT min((SELECT j.run_at FROM jobspool_jobs j WHERE j.state IN ('ready', 'retryable')
                 AND j.kind = p.kind AND j.priority = p.priority AND j.run_at > {NOW}
                 AND j.state = 'retryable' ORDER BY j.run_at LIMIT 1)) FROM p)
  ELSE
    (SELECT min(run_at) FROM jobspool_jobs WHERE state IN ('ready', 'retryable')
       AND state = 'retryable' AND run_at > {NOW} {{kinds}})
  END,
  (SELECT min(expires_at) FROM jobspool_jobs WHERE state = 'leased' AND expires_at > {NOW}
     {{kinds}}),
  NULL), {NOW}
"""


@functools.lru_cache(maxsize=64)
def next_due_sql(kinds: tuple[str, ...] | None) -> str:
    """`_NEXT_DUE` for these kinds (None: every kind)."""
    return _NEXT_DUE.replace("{kinds}", kind_filter(None if kinds is None else list(kinds)))
