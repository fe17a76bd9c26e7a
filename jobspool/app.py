"""`App`: what `--app MODULE:ATTR` names — handlers, replay hooks, a projection URI."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from jobspool.errors import AppError as AppError
from jobspool.errors import ConfigError
from jobspool.policy import Policy, check_policies
from jobspool.queue.config import Handler
from jobspool.queue.job import Job, validate_kind
from jobspool.schedules import Schedule, check_schedules


@dataclass(frozen=True)
class App:
    """Handlers by kind, optional replay hooks by kind (DESIGN §6), optional projection URI.

    `keys` names the key column per projection table when it is not `id`;
    `storage_options` configure an object-storage projection (`s3://...`:
    endpoint, keys, region, `allow_http`), passed to `lancedb.connect`.
    """

    handlers: Mapping[str, Handler]
    # Replay hooks by kind, or one hook for every kind (DESIGN §6).
    replay: Mapping[str, Callable[[Job], str]] | Callable[[Job], str] = field(default_factory=dict)
    projection: str | os.PathLike[str] | Any = None  # a URI, a path, a ProjectionStore
    # The rest by name only (DESIGN §9 names them so): `App(h, r, p, policies, schedules)`
    # filed the policies under `keys` and failed saying "policies ... got list".
    _: KW_ONLY
    keys: Mapping[str, str] = field(default_factory=dict)
    policies: Mapping[str, Policy] = field(default_factory=dict)  # kind -> Policy (DESIGN §9)
    schedules: Sequence[Schedule] = ()  # periodic jobs, fired by `worker` (jobspool.schedules)
    storage_options: Mapping[str, str] | None = None  # the projection's object storage settings

    def __post_init__(self) -> None:
        if not isinstance(self.handlers, Mapping):
            raise AppError(f"App handlers must be a mapping of kind -> function, "
                           f"got {type(self.handlers).__name__}")
        if isinstance(self.replay, Mapping):
            hooks: Mapping[str, Any] = self.replay
        elif callable(self.replay):
            hooks = {}
        else:
            raise AppError(f"App replay must be a mapping of kind -> hook, or one hook for every "
                           f"kind, got {type(self.replay).__name__}")
        for what, table in (("handler", self.handlers), ("replay hook", hooks)):
            for kind, fn in table.items():
                validate_kind(kind)
                if not callable(fn):
                    raise AppError(f"{what} for kind {kind!r} is not callable: {fn!r:.80}")
        if not isinstance(self.keys, Mapping):
            raise AppError(f"App keys must be a mapping of table -> key column, got "
                           f"{self.keys!r:.80}")
        object.__setattr__(self, "policies", check_policies(self.policies, self.handlers))
        object.__setattr__(self, "schedules", check_schedules(self.schedules, self.handlers))
        from jobspool.projection.objectstore import check_storage_options
        from jobspool.projection.spec import check_usable

        try:
            object.__setattr__(self, "storage_options", check_storage_options(self.storage_options))
            check_usable(self.projection, self.keys, self.storage_options)
        except ConfigError as exc:
            raise AppError(str(exc)) from None


# What `as_app` reads of an object with `handlers`, beside them; each left to App's default
# when the object has none.
_APP_FIELDS = ("replay", "projection", "keys", "policies", "schedules", "storage_options")


def as_app(obj: Any, *, name: str = "app") -> App:
    """Accept an `App`, any object with a `handlers` mapping, or a plain mapping of handlers."""
    if isinstance(obj, App):
        app = obj
    elif isinstance(obj, Mapping):
        app = _built(name, handlers=_field(obj, None, name))
    else:
        handlers = _field(obj, "handlers", name)
        if not isinstance(handlers, Mapping):
            raise AppError(f"{name} is not an App, an object with a 'handlers' mapping, or a "
                           f"mapping of kind -> handler (got {type(obj).__name__})")
        fields = {attr: value for attr in _APP_FIELDS
                  if (value := _field(obj, attr, name)) is not None}
        app = _built(name, handlers=handlers, **fields)
    if not app.handlers:
        raise AppError(f"{name} has no handlers")
    return app


def _field(obj: Any, attr: str | None, name: str) -> Any:
    """`obj.attr` (`obj` itself for None; None when it has no such attribute), a mapping
    copied so that the app cannot change under the worker. The object is the user's code:
    a property or `__getattr__` that raises, or a mapping that cannot be read, is a line
    naming it, not a traceback out of the CLI."""
    what = "it" if attr is None else f"its {attr!r}"
    try:
        value = obj if attr is None else getattr(obj, attr, None)
        return dict(value) if isinstance(value, Mapping) else value
    except Exception as exc:
        raise AppError(f"{name}: reading {what} failed: {_described(exc)}") from None


def _built(name: str, **fields: Any) -> App:
    """`App(**fields)`, its refusal said of `name` (what `--app` named): App's own checks,
    not a second copy of them, decide what a plain object or mapping may hold."""
    try:
        return App(**fields)
    except ConfigError as exc:
        # The same type (a PolicyError stays one), its message now naming the object.
        raise type(exc)(f"{name}: {exc}") from None


def _described(exc: BaseException) -> str:
    """`Type: message`, or the type alone for an exception without one (a bare
    `raise KeyboardInterrupt` read `KeyboardInterrupt: `)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextlib.contextmanager
def _signals_seen(seen: list[int]) -> Iterator[None]:
    """Record in `seen` each SIGINT/SIGTERM arriving meanwhile, by wrapping the
    Python handlers in place (the default Ctrl-C one, the CLI's SIGTERM one), which still
    run and raise as before.

    A KeyboardInterrupt is either a signal (an operator's Ctrl-C) or code raising it; only
    this record tells them apart. Signals run their Python handlers in the main thread
    only, so elsewhere nothing is wrapped and none is ever recorded; an ignored or
    default (process-killing) disposition is left alone, since no exception comes of it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wrapped: list[tuple[signal.Signals, Any, Any]] = []  # (signal, wrapper, handler)
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(signum)
        if not callable(previous):
            continue

        def record(num: int, frame: Any, previous: Callable[..., Any] = previous) -> Any:
            seen.append(num)
            return previous(num, frame)

        signal.signal(signum, record)
        wrapped.append((signum, record, previous))
    try:
        yield
    finally:
        for signum, record, previous in wrapped:
            # A module that set its own handler as it imported keeps it.
            if signal.getsignal(signum) is record:
                signal.signal(signum, previous)


def load_app(spec: str) -> App:
    """Import `MODULE:ATTR` (uvicorn/arq style) and normalize it to an `App`."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppError(f"--app {spec!r} must look like MODULE:ATTR (e.g. myproject.jobs:app)")
    # Like uvicorn: the working directory is importable, so `--app tasks:app` finds ./tasks.py.
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    seen: list[int] = []  # signals that came while it imported
    try:
        with _signals_seen(seen):
            module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise AppError(f"--app {spec!r}: cannot import module {module_name!r} ({exc})") from None
    except SystemExit as exc:
        # A script run as a module: its sys.exit() or argparse (reading *our* command line)
        # would end the command silently, or with a usage text that is not ours.
        raise AppError(f"--app {spec!r}: importing {module_name!r} called sys.exit("
                       f"{exc.code!r}); is it a script rather than a module defining the "
                       "app?") from None
    except KeyboardInterrupt as exc:
        if seen:  # a Ctrl-C (or the CLI's SIGTERM) while it imported: an interrupt, not a bug
            raise
        # No signal came: the module's own code raised it. Left to propagate, it read as
        # "interrupted by SIGINT", exit 130, with nobody having pressed Ctrl-C.
        raise AppError(f"--app {spec!r}: importing {module_name!r} failed: {_described(exc)} "
                       "(raised by the module's code; no signal came)") from None
    except BaseException as exc:
        # Not an Exception (`class Boom(BaseException)`, GeneratorExit): still the module
        # failing to import, which deserves the one line an Exception gets, not a traceback.
        raise AppError(f"--app {spec!r}: importing {module_name!r} failed: "
                       f"{_described(exc)}") from None
    obj: Any = module
    parts = attr.split(".")
    for i, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            # Which step failed: "module 'm' has no attribute 'app.nope'" sent people
            # looking for a module attribute named with a dot.
            owner = (f"module {module_name!r}" if i == 0
                     else f"{module_name}:{'.'.join(parts[:i])}")
            raise AppError(f"--app {spec!r}: {owner} has no attribute {part!r}") from None
        except Exception as exc:  # a module-level __getattr__ (lazy loading) that failed
            raise AppError(f"--app {spec!r}: reading {attr!r} failed: "
                           f"{type(exc).__name__}: {exc}") from None
    return as_app(obj, name=f"--app {spec!r}")
