"""Connections to the database: one pool per process, retries across a server restart.

Every statement the store sends is either guarded (a settle or heartbeat that
checks id, token, state and expiry, so repeating it changes nothing twice) or
a read, so a statement cut off by a lost connection is simply sent again on a
fresh one, with backoff, for up to `reconnect_seconds`. Past that, or on any
other database error, the caller gets one `SpoolError` line naming the cause.
A claim cut off after the server ran it leaves leases nobody holds: they
expire and the sweep reclaims them (an attempt and a rescue counted), as for
a worker that died.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from jobspool.errors import ConfigError, SpoolClosed, SpoolError, StoreUnavailable, one_line
from jobspool.pg.schema import FENCE_GONE
from jobspool.urls import redact_url, scrub_password, stray_at

try:
    import psycopg
    from psycopg import conninfo as _conninfo
except ImportError as exc:  # the `postgres` extra is optional
    raise SpoolError("a postgresql:// spool needs the postgres extra: "
                     "pip install 'jobspool[postgres]'") from exc

from jobspool.pg.pool import CONNECT_TIMEOUT, CONNECTIONS, Pool, PoolExhausted

log = logging.getLogger("jobspool.pg")
T = TypeVar("T")

POOL_WAIT = 10.0  # seconds a thread waits for a free connection before the retry loop
# Openings of a transaction block (`block`), each after the outage was waited out.
BLOCK_OPEN_TRIES = 3
CONFLICT_RETRIES = 8  # a statement chosen as a deadlock's victim is sent again this often


def display_url(url: str) -> str:
    """The URL without its password, for messages and `jobspool init`; the rest (query
    options such as a search_path) is kept, so the URL shown still names this spool."""
    shown = redact_url(url)
    if stray_at(url):
        # First: libpq splits at the first '@' or '/', and the rest became the host
        # ("failed to resolve host 'abc@db'") or a query it quoted back, showing the part
        # of the password after it.
        raise ConfigError(f"bad PostgreSQL URL {shown}: an '@' stands where no user or "
                          "password can be: percent-encode the password's '@', '/', '?' "
                          "and '#' (%40, %2F, %3F, %23), and an '@' in a query value (%40)")
    try:
        parts = _conninfo.conninfo_to_dict(url)
    except psycopg.Error as exc:
        # Bad input, not a spool that refuses: the CLI exits 1 for it (DESIGN §8).
        raise ConfigError(f"bad PostgreSQL URL: {scrub_password(one_line(exc), url)}") from None
    # Checked here: with a host name, libpq hands the port to the name lookup as a service
    # name, and `localhost:abc` was "failed to resolve host 'localhost'" (a DNS failure,
    # exit 2) where `127.0.0.1:abc` named the port.
    for port in str(parts.get("port") or "").split(","):
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(f"bad PostgreSQL URL {shown}: port {port!r} is not a TCP port "
                              "(a number from 1 to 65535)")
    return shown


# Failures that mean "not reachable for now", which a worker waits out (StoreUnavailable):
# no SQLSTATE (refused, reset, timed out), a connection exception (class 08), too many
# connections (53300), a server shutting down or starting up (57P0x). Other failures to
# connect (a wrong password, a database that does not exist) are refusals: waiting does
# not cure them.
# 57P05: a session the server ended for idling past `idle_session_timeout` (a pooled
# connection: producers got "refused enqueue", and workers exited). 55P03: a statement
# cut off by the role's `lock_timeout` (an operator's `LOCK TABLE` held longer ended
# every worker): a lock is held for a while, so it is sent again and waited out as an
# outage. Not 57014 (`statement_timeout`, `pg_cancel_backend`): a statement that always
# runs past a role's timeout would be retried for ever (a worker ran every handler and
# settled nothing); it is refused at once, as before.
_NOT_SERVING = frozenset({"57P01", "57P02", "57P03", "57P05", "55P03"})
# For a failed connect, which carries no SQLSTATE. An ordinary role meets the slots kept
# for superusers first ("remaining connection slots are reserved ..."), not "too many
# clients" (53300): its workers exited 2 when the server's connections ran out.
_NOT_SERVING_WORDS = ("starting up", "shutting down", "in recovery", "too many clients",
                      "remaining connection slots are reserved",
                      "terminating connection", "not yet accepting connections")
# libpq refusing the URL's own options before it reaches any server ("connection is bad:
# invalid sslmode value", a port that is no number): a typo no wait cures. A worker
# waited 30 s for it as for an outage, then exited saying the store was unavailable.
_BAD_OPTION = re.compile(r"connection is bad: invalid [\w ]*value|invalid connection option|"
                         r"invalid port number")


# A statement cut off is not a lost connection: inside a transaction block it is the
# block's own failure (its handler's policy decides), as it always was.
_CUT_OFF = frozenset({"55P03"})

_CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


def transient(exc: BaseException) -> bool:
    """Whether a database error means "unreachable for now", not "refused"."""
    if isinstance(exc, PoolExhausted):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    if state is None:
        # A failed connect carries no SQLSTATE: a server that answered with FATAL refused
        # us (no such database or role, a password), unless it is starting or stopping.
        text = str(exc)
        return "FATAL:" not in text or any(w in text for w in _NOT_SERVING_WORDS)
    return state.startswith("08") or state in _NOT_SERVING or state == "53300"


def connect_error(exc: BaseException, message: str) -> SpoolError:
    """`StoreUnavailable` (wait for it) when `exc` is transient, else `SpoolError`."""
    return StoreUnavailable(message) if transient(exc) else SpoolError(message)


def _check_options(exc: BaseException, display: str, line: str) -> None:
    """Raise `ConfigError` when libpq refused the URL's own options: bad input (exit 1),
    as a URL that does not parse is, never a database that refused or is down."""
    if _BAD_OPTION.search(str(exc)):
        raise ConfigError(f"bad PostgreSQL URL {display}: {line}") from None


_DATABASES: weakref.WeakSet[Database] = weakref.WeakSet()


def _release_after_fork() -> None:
    """In a forked child, at once: let go of the parent's sockets and locks. The child's
    copy of a socket kept the parent's session, its open transaction and row locks alive
    after the parent died, for as long as the child lived (a `cancel` elsewhere waited for
    it); a thread of the parent holding a Database's mutex at the fork left it held. The
    socket is replaced by /dev/null, not closed: a `close()` the child's copy of the
    connection makes later must neither reach the parent's session (a Terminate message)
    nor close a descriptor number since reused."""
    devnull = -1
    try:
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        for conn in list(CONNECTIONS):
            with contextlib.suppress(Exception):
                os.dup2(devnull, conn.pgconn.socket, inheritable=False)
    except OSError:
        pass
    finally:
        if devnull >= 0:
            os.close(devnull)
    for db in list(_DATABASES):
        db.forked()


os.register_at_fork(after_in_child=_release_after_fork)


class Database:
    """A lazily opened connection pool for one URL, reopened after a fork."""

    def __init__(self, url: str, *, pool_size: int = 16,
                 reconnect_seconds: float = 30.0) -> None:
        self.url = url
        self.display = display_url(url)
        self.pool_size = max(2, pool_size)
        self.reconnect_seconds = reconnect_seconds
        self._pool: Pool | None = None
        self._pid = 0
        self._mutex = threading.Lock()
        self._pinned = threading.local()
        # Each thread's outermost open block (`pinned`): a handler abandoned past its time
        # limit inside one holds its job's row lock for as long as it runs (`cut_block`).
        self._blocks: dict[int, psycopg.Connection[Any]] = {}
        self.closed = False
        # Set while the process shuts down (Worker.stop): a statement the server cannot
        # take is given up at once instead of retried, so a stop is never held up by an
        # outage; whatever was not settled is leased and expires, to be taken over.
        self.stop_retrying = threading.Event()
        self._down_since: float | None = None  # when the current outage began (any thread)
        _DATABASES.add(self)

    def forked(self) -> None:
        """In a forked child (`_release_after_fork`): a parent thread may have held the
        mutex at the fork; the inherited pool is never used (`_get_pool`). A fenced block
        open on the forking thread stays the parent's: its connection, pinned for the
        block, is a dead socket here, and every later statement of that thread failed
        "connection lost" for the child's whole life."""
        self._mutex = threading.Lock()
        self._pinned = threading.local()
        self._blocks = {}

    @contextmanager
    def patience(self, until: float | None) -> Iterator[None]:
        """Statements this thread sends in the block wait out an outage only until `until`
        (a `time.monotonic()` reading; None: the usual `reconnect_seconds`). For a caller
        with a deadline of its own: `wait(timeout=1)` with the server down was held 30 s."""
        before = getattr(self._pinned, "until", None)
        self._pinned.until = until
        try:
            yield
        finally:
            self._pinned.until = before

    @contextmanager
    def pinned(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """Send this thread's statements through `conn` while the block runs: the
        transaction of a `fenced` block, so what a handler does inside it (a heartbeat, an
        enqueue) joins it instead of waiting on its row lock or for a pooled connection."""
        before = getattr(self._pinned, "conn", None)
        self._pinned.conn = conn
        ident = threading.get_ident()
        pid = os.getpid()
        if before is None:
            self._blocks[ident] = conn
        try:
            yield
        finally:
            if os.getpid() == pid:
                self._pinned.conn = before
                if before is None:
                    self._blocks.pop(ident, None)
            # else: a child forked inside the block leaves it; `forked` cleared what was
            # pinned, and putting back the outer block's connection (the parent's, a dead
            # socket here) failed every later statement of this thread.

    def pinned_here(self) -> bool:
        """Whether a transaction block (a fenced block) is open on this thread."""
        return getattr(self._pinned, "conn", None) is not None

    def cut_block(self, thread_ident: int) -> bool:
        """End the open block of a thread that was given up on (a sync handler past its
        time limit cannot be stopped): its transaction held the job's row lock for as long
        as the handler ran, and the worker's own record of the failure waited on it, the
        run with it, for ever. Its backend is terminated, the transaction rolled back;
        the thread finds its connection lost if it ever goes on. Whether one was open."""
        conn = self._blocks.pop(thread_ident, None)
        if conn is None:
            return False
        pid = conn.pgconn.backend_pid
        self._get_pool().forsake(conn)
        self.run(lambda c: c.execute("SELECT pg_terminate_backend(%s)", (pid,)),
                 what="ending an abandoned handler's fenced block")
        log.warning("database %s: ended the fenced block of a handler abandoned past its "
                    "time limit (backend %d): what it did in the block is rolled back",
                    self.display, pid)
        return True

    @contextmanager
    def block(self, begin: Callable[[psycopg.Connection[Any]], T], *, what: str
              ) -> Iterator[tuple[psycopg.Connection[Any], T]]:
        """A transaction block: `begin(conn)` its first statements, then the caller's.

        Nested in another block on this thread, it runs on that block's pinned connection
        as a savepoint (a pooled connection of its own waited for ever on the row lock its
        outer transaction held). Otherwise on a pooled connection; until `begin` has
        returned nothing of the block has run, so a connection lost meanwhile (a server
        restart, a terminated backend) is waited out as `run` waits (its budget, its
        backoff) and the transaction opened again: a handler's fenced block failed at once
        with the driver's raw error, charged an attempt for an outage it never saw.
        """
        pinned = getattr(self._pinned, "conn", None)
        tries = 1 if pinned is not None else BLOCK_OPEN_TRIES
        pid = os.getpid()
        for attempt in range(1, tries + 1):
            opened = ended = False
            try:
                with contextlib.ExitStack() as stack:
                    conn = stack.enter_context(contextlib.nullcontext(pinned) if pinned
                                               is not None else self.connection())
                    stack.enter_context(conn.transaction())
                    value = begin(conn)
                    opened = True
                    try:
                        yield conn, value
                    finally:
                        if os.getpid() != pid:
                            # A child forked inside the block leaves it: the transaction is
                            # the parent's, its socket a dead copy here (`forked`); ending
                            # it from here only printed psycopg's failed rollback.
                            stack.pop_all()
                    ended = True
                return
            except (psycopg.Error, PoolExhausted) as exc:
                if opened and not ended:
                    raise  # the block's own statements: never sent twice
                if ended or attempt == tries or not transient(exc):
                    # The commit lost (and with it everything the block did), a savepoint
                    # (its transaction is its outer block's), or a refusal.
                    raise self.block_error(exc, f"committing {what}" if ended else what
                                           ) from None
            self._get_pool().drop_idle()
            # Waits out the outage (or raises once `reconnect_seconds` are spent).
            self.run(lambda c: c.execute("SELECT 1"), what=what)

    @contextmanager
    def one_line_errors(self, what: str) -> Iterator[None]:
        """The driver's errors of the statements sent in the block as `block_error`s."""
        try:
            yield
        except psycopg.Error as exc:
            raise self.block_error(exc, what) from None

    def block_error(self, exc: Exception, what: str) -> SpoolError:
        """A driver error in a transaction block as one line: unavailable (`StoreUnavailable`)
        for a lost connection, refused otherwise."""
        if transient(exc):
            return connect_error(exc, f"database {self.display} unavailable during "
                                      f"{what}: {self._line(exc)}")
        return SpoolError(f"database {self.display} refused {what}: {self._line(exc)}")

    def _line(self, exc: BaseException) -> str:
        """A driver error as one line, without the URL's password (a misparsed one shows
        up in the host it names)."""
        return scrub_password(one_line(exc), self.url)

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A connection of its own (LISTEN, migrations), outside the pool."""
        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT,
                                   **kwargs)
            CONNECTIONS.add(conn)
            return conn
        except psycopg.Error as exc:
            _check_options(exc, self.display, self._line(exc))
            raise connect_error(exc, f"cannot connect to {self.display}: {self._line(exc)}"
                                ) from None

    def _get_pool(self) -> Pool:
        pool = self._pool
        if pool is not None and self._pid == os.getpid():
            return pool
        with self._mutex:
            if self.closed:
                raise SpoolClosed(self.display)
            if self._pool is None or self._pid != os.getpid():
                # A pool inherited through fork() shares sockets with the parent: never use it.
                self._pool = Pool(self.url, self.pool_size, self.display)
                self._pid = os.getpid()
            return self._pool

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        with self._get_pool().connection(timeout=POOL_WAIT) as conn:
            yield conn

    def run(self, fn: Callable[[psycopg.Connection[Any]], T], *, what: str = "query") -> T:
        """`fn(conn)` on a pooled autocommit connection, sent again after a lost connection."""
        pinned = getattr(self._pinned, "conn", None)
        if pinned is not None:  # inside a transaction: one try, no retry on another connection
            try:
                return fn(pinned)
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.OperationalError) and transient(exc) and \
                        exc.sqlstate not in _CUT_OFF:
                    # "refused" read as the server's refusal of the statement.
                    raise connect_error(exc, f"database {self.display}: connection lost "
                                             f"during {what}, inside a transaction block "
                                             f"(rolled back): {self._line(exc)}") from None
                raise SpoolError(f"database {self.display} refused {what}: "
                                 f"{self._line(exc)}") from None
        # One outage, one budget: once it has lasted `reconnect_seconds`, every statement
        # gets a single try (which also notices the server is back) instead of its own wait.
        deadline = (self._down_since or time.monotonic()) + self.reconnect_seconds
        until = getattr(self._pinned, "until", None)
        if until is not None:
            deadline = min(deadline, until)
        delay = 0.05
        fresh_tried = False
        conflicts = 0
        while True:
            try:
                # take/give rather than `with self.connection()`: two generator-based
                # context managers were a tenth of a one-job enqueue's client time.
                pool = self._get_pool()
                conn = pool.take(POOL_WAIT)
                try:
                    out = fn(conn)
                finally:
                    pool.give(conn)
                self._down_since = None
                return out
            except (psycopg.OperationalError, PoolExhausted) as exc:
                if isinstance(exc, _CONFLICTS) and conflicts < CONFLICT_RETRIES:
                    # Chosen as a deadlock's victim (or a serialization failure): rolled
                    # back whole, so sent again, as after a lost connection (every statement
                    # is guarded or a read). Concurrent producers replacing the ids a
                    # worker settled deadlocked its settle, and the whole batch of finished
                    # jobs stayed leased, to run again.
                    conflicts += 1
                    time.sleep(random.uniform(0.005, 0.02) * conflicts)
                    continue
                _check_options(exc, self.display, self._line(exc))
                if not transient(exc):
                    # The server answered and refused (out of memory or locks, a limit):
                    # retrying it for reconnect_seconds only delayed the same error.
                    raise SpoolError(f"database {self.display} refused {what}: "
                                     f"{self._line(exc)}") from None
                if not fresh_tried and not isinstance(exc, PoolExhausted):
                    # Once at once, on a new connection, whatever the budget or a stop:
                    # after a server restart every pooled connection is dead though the
                    # server answers. A worker stopped then had each settle fail on one
                    # (a single try while stopping), and threw finished results away.
                    fresh_tried = True
                    self._get_pool().drop_idle()
                    continue
                if self._down_since is None and not isinstance(exc, PoolExhausted):
                    self._down_since = time.monotonic()
                if self.stop_retrying.is_set() or time.monotonic() + delay > deadline:
                    err = connect_error(exc, f"database {self.display} unavailable during "
                                             f"{what}: {self._line(exc)}")
                    if isinstance(err, StoreUnavailable) and self._down_since is not None:
                        # The worker's outage log counts from here: it said "reachable
                        # again after 13 s" of a 41 s outage, the retries' 30 s left out.
                        err.down_for = max(0.0, time.monotonic() - self._down_since)
                    raise err from None
                log.warning("database %s: %s; retrying %s in %.2fs", self.display,
                            self._line(exc), what, delay)
                if self.stop_retrying.wait(delay):
                    continue  # asked to stop meanwhile: one last try, then give up
                delay = min(2.0, delay * 2)
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.errors.UndefinedTable) and \
                        "jobspool_fence" in str(exc):
                    # Dropped under a running worker: say what to do, as an open does.
                    raise SpoolError(f"{self.display}: {FENCE_GONE}") from None
                raise SpoolError(f"database {self.display} refused {what}: "
                                 f"{self._line(exc)}") from None

    def close(self) -> None:
        with self._mutex:
            self.closed = True
            pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            # Inside its own `fenced` block the caller holds a connection it cannot return.
            pool.close(wait=getattr(self._pinned, "conn", None) is None)
