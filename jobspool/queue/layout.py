"""The spool directory's layout: creating it, checking it is safe, and `spool.json`.

Checked before anything is written: the root is a directory we may write,
`spool.json`'s format version is one this code understands, and every state
directory, `tmp/` and `quarantine/` is a real directory inside the root — a
symlink there could send writes outside the spool, so it is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import orjson

from jobspool.errors import SpoolError
from jobspool.queue.fence import decode_fence
from jobspool.queue.job import MAX_JOB_BYTES
from jobspool.queue.perms import (
    ACCESS_MODES,
    DEFAULT_ACCESS,
    dir_mode,
    file_mode,
    make_dir,
    refuse_foreign_writers,
    validate_access,
)
from jobspool.queue.rootspec import refuse_url
from jobspool.queue.states import ALL_STATES
from jobspool.queue.store import LIVE_DIR, POOL_DIR, TMP_DIR, write_atomic

SPOOL_FORMAT = 1
SPOOL_FILE = "spool.json"
QUARANTINE_DIR = "quarantine"
INDEX_DIR = "index"  # where a worker with no projection configured keeps its LanceDB tables
# Jobs per lock hold in administration (recover, prune, fsck): bounds how long a live
# worker waits behind it.
ADMIN_BATCH = 256


def default_projection_uri(root: os.PathLike[str] | str) -> str:
    """The default projection of a spool: `<root>/index`."""
    return str(Path(root) / INDEX_DIR)


def default_projection_of(spool: Any) -> str:
    """Where a worker on `spool` projects by default: `<root>/index`, unless this machine
    has another directory for the same database (a store naming its directory by URL,
    reached by another spelling of it: `?application_name=`, `localhost`, `postgres://`)
    that holds the index already. Per spelling, each worker wrote an index of its own, and
    each held only the rows of the runs that named the database its way."""
    own = default_projection_uri(spool.root)
    siblings = getattr(spool, "sibling_local_dirs", None)
    if siblings is None or os.path.isdir(own):
        return own
    for directory in siblings():
        there = default_projection_uri(directory)
        if os.path.isdir(there):
            return there
    return own


def projection_inside_spool(root: os.PathLike[str] | str, uri: str) -> str | None:
    """Why a local projection `uri` may not live where it is, or None: inside one of the
    spool's own directories (or the spool itself) its files would be read as jobs, or
    quarantined by `recover`. `<root>/index` and other new directories are fine."""
    from jobspool.projection.objectstore import local_path

    local = local_path(uri)
    if local is None:
        return None  # object storage
    first = _first_inside(Path(root), Path(local))
    if first is None:
        return None
    if first == "":
        return f"projection {uri} is the spool directory itself"
    if first != INDEX_DIR and (first in _SPOOL_ENTRIES or first in _LAZY_DIRS):
        return f"projection {uri} is inside the spool's own {first}/ (use {root}/index)"
    return None


def _first_inside(root: Path, path: Path) -> str | None:
    """The first component of `path` below the directory `root` ("" for `root` itself), or
    None when it is not below it, however either is spelled: by real path (symlinks), then
    by the identity of `path`'s existing ancestors (another mount of the same directory).
    Compared as written (`abspath`), a symlinked spelling of either got a projection into
    the spool's tmp/, which the next `recover` deleted whole."""
    here = Path(os.path.realpath(path))
    spool = Path(os.path.realpath(root))
    with contextlib.suppress(ValueError):
        parts = here.relative_to(spool).parts
        return parts[0] if parts else ""
    try:
        spool_stat = os.stat(spool)
    except OSError:
        return None
    below: list[str] = []
    for step in (here, *here.parents):
        try:
            if os.path.samestat(os.stat(step), spool_stat):
                return below[-1] if below else ""
        except OSError:
            pass
        below.append(step.name)
    return None
SUBDIRS: tuple[str, ...] = (*(s.value for s in ALL_STATES), TMP_DIR, POOL_DIR, LIVE_DIR,
                            QUARANTINE_DIR)


@dataclass(frozen=True, slots=True)
class SpoolSettings:
    """The settings a spool was created with (defaults for every later opener)."""

    lease_seconds: float
    max_attempts: int
    retry_base_seconds: float
    retry_max_seconds: float
    keep_terminal: int
    max_rescues: int | None
    prepare_grace_seconds: float
    max_job_bytes: int = MAX_JOB_BYTES
    access: str = DEFAULT_ACCESS
    keep_terminal_seconds: float | None = None  # retention by age (None: by count only)
    # Dead letters' own count (DESIGN §3): None keeps max(keep_terminal, DEFAULT_KEEP_DEAD).
    keep_dead: int | None = None


# Dead letters are evidence an operator may still need: by default a spool keeps at least
# this many of them, however few completed jobs it keeps (Sidekiq's dead set keeps 10,000).
DEFAULT_KEEP_DEAD = 10_000


def effective_keep_dead(settings: SpoolSettings) -> int:
    """How many dead letters retention keeps (see `SpoolSettings.keep_dead`)."""
    if settings.keep_dead is not None:
        return settings.keep_dead
    return max(settings.keep_terminal, DEFAULT_KEEP_DEAD)


@dataclass
class Layout:
    root: Path
    settings: dict[str, Any]
    created: bool
    durable: bool
    access: str = DEFAULT_ACCESS
    # Held from the check that the spool is new until its spool.json and fence are written
    # (`end_creation`): see `_creation_lock`.
    creation_fd: int | None = None

    def end_creation(self) -> None:
        fd, self.creation_fd = self.creation_fd, None
        if fd is not None:
            os.close(fd)  # drops the flock

    def save_settings(self, settings: SpoolSettings) -> None:
        doc = {"format": SPOOL_FORMAT, "settings": asdict(settings)}
        write_atomic(self.root / SPOOL_FILE, orjson.dumps(doc, option=orjson.OPT_INDENT_2),
                     durable=self.durable, mode=file_mode(self.access))


# What to do about a spool.json that cannot be read as one (a truncated or hand-broken
# file): `init` refused it without a word on how to go on.
_SETTINGS_LOST = ("; fix it by hand, or move it away and run `jobspool init` (the settings "
                  "then go back to their defaults or the options given; the jobs stay)")


def read_spool_file(root: Path) -> dict[str, Any] | None:
    path = root / SPOOL_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        # A reader who is not the owner meets this first: new spools are private (0700).
        hint = (" (spools are private to their owner: to let others read one, create it "
                "with `jobspool init --access group-read` and read as a member of its group)"
                if exc.errno in (errno.EACCES, errno.EPERM) else "")
        raise SpoolError(f"cannot read {path}: {exc.strerror}{hint}", path=str(path)) from None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise SpoolError(f"{path} is not valid JSON{_SETTINGS_LOST}", path=str(path)) from None
    if not isinstance(doc, dict):
        raise SpoolError(f"{path} is not a JSON object{_SETTINGS_LOST}", path=str(path))
    version = doc.get("format")
    if not isinstance(version, int) or isinstance(version, bool):
        raise SpoolError(f"{path} has no integer format version", path=str(path))
    if version > SPOOL_FORMAT:
        raise SpoolError(
            f"spool {root} has format version {version}, newer than this jobspool "
            f"understands (format {SPOOL_FORMAT}); upgrade jobspool", path=str(path))
    return doc


log = logging.getLogger(__name__)

def open_layout(root: Path, *, create: bool, durable: bool, read_only: bool = False,
                access: str | None = None) -> Layout:
    """Check (and with `create`, make) the spool directory; raise `SpoolError` naming the path.

    A spool being created is made under `_creation_lock`, which the caller releases with
    `Layout.end_creation` once it has written spool.json and the fence.
    """
    refuse_url(root)
    if not create or read_only or os.path.lexists(root / SPOOL_FILE):
        return _open_layout(root, create=create, durable=durable, read_only=read_only,
                            access=access)
    # The lock is on the root's parent, made first (after the checks that need nothing
    # made): "the nearest existing directory above" moved down as the first creator made
    # the missing ones, and a second creator locked another directory, never waited, and
    # chmod'ed a group spool private.
    _refuse_inside_another_spool(root)
    _refuse_too_long(root)
    with contextlib.suppress(OSError):  # a file in the way: `_open_layout` names it
        root.parent.mkdir(parents=True, exist_ok=True)
    fd = _creation_lock(root)
    try:
        layout = _open_layout(root, create=create, durable=durable, read_only=read_only,
                              access=access)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    if layout.created:
        layout.creation_fd = fd
    elif fd is not None:
        os.close(fd)  # another opener finished creating it while we waited
    return layout


CREATION_LOCK_SECONDS = 5.0


def _creation_lock(root: Path) -> int | None:
    """An exclusive flock on the nearest existing directory above `root`, for the making
    of a spool. Processes opening a new root at once each saw it half made: one took a
    spool.json without its fence yet for a lost fence (a warning, tokens restarted ~1e15
    up), another the fence without spool.json for a deleted spool.json, and each wrote its
    own settings, the last winning. The parent, not the root, so that nothing is made
    before the root is checked; a directory's flock writes nothing. None where it cannot
    be taken (no such directory readable): creation goes on unserialized, as before."""
    parent = root.absolute().parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    # Polled, and bounded: the directory above may be another spool's root, whose own
    # lock (held by this very thread, in a fenced block) flocks it too. That spool refuses
    # the new one inside it anyway; going on unserialized beats waiting on ourselves.
    deadline = time.monotonic() + CREATION_LOCK_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.005)
        except OSError:
            break
    os.close(fd)
    return None


def _open_layout(root: Path, *, create: bool, durable: bool, read_only: bool = False,
                 access: str | None = None) -> Layout:
    """`open_layout`'s checks and making, once creation is serialized.

    `access` ("private", "group" or "group-read", see `perms.py`) applies when the spool is
    created; an existing spool keeps the one saved in its `spool.json`.

    `read_only` opens an existing spool with read access alone (never creating
    anything): what `stats`, `list`, `show`, `health` and `fsck` need.
    """
    create = create and not read_only
    try:
        st = root.stat()
    except FileNotFoundError:
        if not create:
            raise SpoolError(f"spool {root} does not exist (run `jobspool init`)",
                             path=str(root)) from None
        st = None
    except OSError as exc:
        raise SpoolError(f"cannot access spool {root}: {exc.strerror}", path=str(root)) from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise SpoolError(f"spool root {root} is not a directory", path=str(root))
    doc = read_spool_file(root) if st is not None else None
    if st is not None and doc is None and create:
        _refuse_foreign_directory(root)
    if doc is None and create:
        _refuse_inside_another_spool(root)
    if st is not None and doc is None and not create:
        # Before any directory is made: a mistyped root must be left exactly as it was.
        raise SpoolError(f"{root} is not a spool (no {SPOOL_FILE}; run `jobspool init`)",
                         path=str(root))
    if access is not None:
        validate_access(access)
    settings = doc.get("settings", {}) if doc is not None else {}
    if not isinstance(settings, dict):
        raise SpoolError(f"{root / SPOOL_FILE}: 'settings' is not an object",
                         path=str(root / SPOOL_FILE))
    unknown = sorted(set(settings) - {f.name for f in fields(SpoolSettings)})
    if unknown:
        # A hand edit's misspelled name ("max_attemps") silently kept the default.
        log.warning("%s: unknown setting(s) %s ignored (known: %s)", root / SPOOL_FILE,
                    ", ".join(map(repr, unknown)),
                    ", ".join(f.name for f in fields(SpoolSettings)))
    saved = settings.get("access")
    if saved is not None:
        try:
            validate_access(saved)
        except SpoolError as exc:  # a hand edit: name the file, as every other setting does
            raise SpoolError(f"{root / SPOOL_FILE}: {exc}", path=str(root / SPOOL_FILE)) from None
    # A spool whose spool.json was deleted (it has jobs, a fence): its settings are gone,
    # but its directory's mode still says who may use it; resetting that to `private`
    # locked its group out, and defaults replaced its settings without a word.
    orphaned = st is not None and doc is None and create and _used_spool(root)
    # A creation cut short (its state directories made, no spool.json yet) keeps the access
    # its creator gave the directory, as an orphaned spool does: reopened by a default
    # opener, a group spool became private.
    half_made = (st is not None and doc is None and create and not orphaned
                 and all(os.path.isdir(root / s.value) for s in ALL_STATES))
    if (orphaned or half_made) and saved is None and access is None:
        saved = _access_of(st.st_mode) if st is not None else None
    if doc is not None and saved is None and st is not None:
        # A spool.json without its access (an older release's, or a hand edit that lost
        # the key or the whole settings object): the directory's mode says it. The
        # default made a group spool's new files private, and its group's workers could
        # not read them.
        saved = _access_of(st.st_mode)
    chosen = validate_access(saved if saved is not None else (access or DEFAULT_ACCESS))
    if orphaned:
        log.warning("%s is missing from the spool %s (deleted?): its settings are back to "
                    "their defaults or the ones given now (access %s kept from its mode); "
                    "set them again with `jobspool init` options if they differed",
                    SPOOL_FILE, root, chosen)
    if access is not None and saved is not None and access != chosen:
        # Silently keeping the saved modes would leave a service that asked for a group
        # spool with one its group cannot use (or widen nothing the caller expected).
        raise SpoolError(f"spool {root} was created with access={chosen!r}; access={access!r} "
                         "applies only when a spool is created (it is kept in "
                         f"{SPOOL_FILE})", path=str(root))
    if st is None or (doc is None and create):
        _refuse_too_long(root)
    if st is None:
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
            make_dir(root, dir_mode(chosen))
        except FileExistsError:
            pass  # a racing opener made it
        except OSError as exc:
            raise SpoolError(f"cannot create spool {root}: {exc.strerror}",
                             path=str(root)) from None
        st = root.stat()
    elif doc is None and create and not orphaned:
        os.chmod(root, dir_mode(chosen))  # an empty directory we are turning into a spool
        st = root.stat()
    refuse_foreign_writers(root, st)
    if read_only:
        if not os.access(root, os.R_OK | os.X_OK):
            raise SpoolError(f"spool {root} is not readable", path=str(root))
    elif not os.access(root, os.W_OK | os.X_OK):
        raise SpoolError(f"spool {root} is not writable (open it read-only to inspect it: "
                         "`jobspool stats`, `list`, `show`, `health`, `fsck` and "
                         "`dashboard --read-only` need read access alone)", path=str(root))
    for name in SUBDIRS:
        if read_only and name not in _STATE_NAMES and not os.path.lexists(root / name):
            continue  # a reader needs the state directories only
        # `live/` came with a later version: an existing spool gets it on first open. The
        # scratch directories hold nothing a job depends on: a writer recreates them after
        # an operator's `rm -rf tmp` instead of refusing the spool for good.
        _ensure_dir(root, name, create=create or doc is None or (
            not read_only and name in _SCRATCH_DIRS), mode=dir_mode(chosen),
            adopt=doc is None and create and not orphaned)
    for name in _LAZY_DIRS:
        # Made when first written (a worker's metrics, a job's progress): a symlink there
        # would send those writes outside the spool, as one in place of a state directory.
        if (root / name).is_symlink():
            raise SpoolError(f"{root / name} is a symlink; the spool's directories must be "
                             "real directories inside it (remove the link)",
                             path=str(root / name))
    if doc is None and not create:
        raise SpoolError(f"{root} is not a spool (no {SPOOL_FILE}; run `jobspool init`)",
                         path=str(root))
    for name in _CONTROL_FILES:
        # `.lock`'s shared memory hands out fencing tokens, `fence` bounds them and
        # `spool.json` holds the settings: writable by anyone, they are anyone's to forge.
        try:
            refuse_foreign_writers(root / name, (root / name).stat())
        except FileNotFoundError:
            continue
    return Layout(root=root, settings=settings, created=doc is None, durable=durable,
                  access=chosen)


_STATE_NAMES = frozenset(s.value for s in ALL_STATES)
_SCRATCH_DIRS = frozenset({TMP_DIR, POOL_DIR, QUARANTINE_DIR, LIVE_DIR})
_LAZY_DIRS = ("metrics", "progress")  # metrics.METRICS_DIR, jobprogress.PROGRESS_DIR
_CONTROL_FILES = (".lock", "fence", SPOOL_FILE)

# What a spool directory may already hold before its spool.json exists: a fresh or
# half-created spool (a crash during creation, or a racing opener), never user data.
_SPOOL_ENTRIES = frozenset({*(s.value for s in ALL_STATES), TMP_DIR, QUARANTINE_DIR, LIVE_DIR, ".lock",
                            "fence", SPOOL_FILE,
                            # What a spool gains once used (metrics.py, jobprogress.py,
                            # marks.py, the default projection): `init` after an operator
                            # deleted spool.json must not take the spool for a stranger's.
                            "metrics", "progress", "schedules.json", INDEX_DIR})


def _refuse_inside_another_spool(root: Path) -> None:
    """Refuse a new spool inside another spool's own directories: the outer one's `recover`
    deleted it from `tmp/` or quarantined it from a state directory (`<outer>/index` and
    other new names are the outer spool's to leave alone, and fine)."""
    here = Path(os.path.realpath(root))  # a symlinked spelling is not a way in
    for outer in here.parents:
        if (outer / SPOOL_FILE).is_file():
            first = here.relative_to(outer).parts[0]
            if first != INDEX_DIR and (first in _SPOOL_ENTRIES or first in _LAZY_DIRS):
                raise SpoolError(f"{root} is inside the spool {outer}'s own {first}/, where "
                                 "that spool's recover would delete or quarantine it; put "
                                 "the new spool elsewhere", path=str(root))


def _used_spool(root: Path) -> bool:
    """Whether a directory without spool.json was a spool in use (a fence that handed a
    token out, or a job). A fence still at 0 is a creation cut short between the fence
    and spool.json (written in that order, `Journal`): nothing to warn about."""
    if os.path.lexists(root / "fence"):
        try:
            if decode_fence((root / "fence").read_bytes()) > 0:
                return True
        except (OSError, ValueError):
            return True  # unreadable: it may have been anything
    for state in ALL_STATES:
        try:
            with os.scandir(root / state.value) as it:
                if any(e.name.endswith(".json") for e in it):
                    return True
        except OSError:
            continue
    return False


def _access_of(mode: int) -> str | None:
    """The access whose directory mode `mode` has, if any."""
    for name, (dmode, _) in ACCESS_MODES.items():
        if mode & 0o7777 == dmode:
            return name
    return None


def _refuse_foreign_directory(root: Path) -> None:
    """Refuse to turn a non-empty directory that is not a spool into one (a mistyped --root
    would otherwise get state directories sprinkled among the user's files)."""
    try:
        foreign = sorted(n for n in os.listdir(root)
                         if n not in _SPOOL_ENTRIES and not n.startswith((".spool.json.", ".fence.")))
    except OSError as exc:
        raise SpoolError(f"cannot list {root}: {exc.strerror}", path=str(root)) from None
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise SpoolError(f"{root} is not empty and is not a spool (no {SPOOL_FILE}; it holds "
                         f"{shown}); pass an empty or new directory", path=str(root))
    stray = _stray_content(root)
    if stray is not None:
        raise SpoolError(f"{root} is not a spool (no {SPOOL_FILE}, .lock or fence) and holds "
                         f"{stray}, which no spool in the making does; pass an empty or new "
                         "directory",
                         path=str(root))


def _stray_content(root: Path) -> str | None:
    """In a directory with spool-named entries but no control file (`.lock`, `fence`: a
    spool that ever held a job has them), the first entry holding what no spool in the
    making does: a half-made spool has empty directories (`tmp/pool` in `tmp/`), one
    copied without its control files has job files in its state directories. A lone
    `tmp/` of the user's, or a whole spool at `<root>/ready`, was taken for a spool's: the
    next `recover` deleted what `tmp/` held and quarantined the other spool piece by piece.
    """
    if any(os.path.lexists(root / name) for name in (".lock", "fence")):
        return None
    for name in sorted(os.listdir(root)):
        path = root / name
        if name.startswith((".spool.json.", ".fence.")) or not path.is_dir() \
                or path.is_symlink():
            continue  # a file named like a spool's: its own reader says what it is
        try:
            inside = sorted(os.listdir(path))
            if name == TMP_DIR and inside == ["pool"] and (path / "pool").is_dir():
                inside = [f"pool/{n}" for n in sorted(os.listdir(path / "pool"))]
        except OSError:
            continue
        if SPOOL_FILE in inside:
            return f"{name}/ (a spool of its own)"
        if name in _STATE_NAMES:
            inside = [n for n in inside
                      if not (n.endswith(".json") and (path / n).is_file()
                              and not (path / n).is_symlink())]
        if inside:
            return f"{name}/{inside[0]}"
    return None


def _ensure_dir(root: Path, name: str, *, create: bool, mode: int, adopt: bool = False
                ) -> None:
    """Make (or check) a spool directory; `adopt`: one already there when the spool is being
    created (an empty `tmp/` of the user's) gets the spool's mode, as the root does: it
    stayed 0755 in a private spool."""
    path = root / name
    try:
        st = path.lstat()
    except FileNotFoundError:
        if not create:
            raise SpoolError(f"spool directory {path} is missing (the jobs it held are gone); "
                             f"`jobspool --root {root} init` recreates it empty",
                             path=str(path)) from None
        try:
            make_dir(path, mode)
        except FileExistsError:
            return _ensure_dir(root, name, create=False, mode=mode)  # a racing opener made it
        except OSError as exc:
            code = errno.errorcode.get(exc.errno or 0, "")
            raise SpoolError(f"cannot create {path}: {exc.strerror} {code}".rstrip(),
                             path=str(path)) from None
        return None
    if stat.S_ISLNK(st.st_mode):
        raise SpoolError(f"{path} is a symlink (to {os.readlink(path)}); the spool's "
                         "directories must be real directories inside it: replace the link "
                         "with a directory and move what its target holds into it (the jobs "
                         "there are the spool's)", path=str(path))
    if not stat.S_ISDIR(st.st_mode):
        raise SpoolError(f"{path} is not a directory (move it away; `jobspool init` makes "
                         "the directory again)", path=str(path))
    refuse_foreign_writers(path, st)
    if adopt and stat.S_IMODE(st.st_mode) != mode and st.st_uid == os.geteuid():
        os.chmod(path, mode)
    return None


# What a spool writes below its root at most: a state or quarantine directory, a job id
# of 128 characters, a temporary or quarantine suffix (bytes, with room to spare).
_BELOW_ROOT_BYTES = 320


def _refuse_too_long(root: Path) -> None:
    """A root too long for the job files under it (PATH_MAX) is refused when created: it
    was made, then every enqueue failed (ENAMETOOLONG, reported as an unreadable file
    taking the id)."""
    limit = os.pathconf("/", "PC_PATH_MAX") if hasattr(os, "pathconf") else 4096
    size = len(os.fsencode(os.path.abspath(root)))
    if size + _BELOW_ROOT_BYTES >= limit:
        raise SpoolError(f"spool root is {size} bytes long: too long for the job files under "
                         f"it (the system's paths stop at {limit}; keep the root under "
                         f"{limit - _BELOW_ROOT_BYTES})", path=str(root))

