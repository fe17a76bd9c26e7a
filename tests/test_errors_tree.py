"""The error tree: every class lives in `jobspool.errors`, is exported and pickles."""

from __future__ import annotations

import inspect
import pickle

import pytest

import jobspool
import jobspool.errors as errors
from jobspool import Spool, Worker
from jobspool.errors import JobspoolError

ERROR_CLASSES = sorted(
    (obj for obj in vars(errors).values()
     if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__),
    key=lambda cls: cls.__name__,
)

# Constructor arguments for the classes whose __init__ takes more than a message.
_ARGS: dict[str, tuple[object, ...]] = {
    "JobNotFound": ("j1",),
    "JobPruned": ("j1",),
    "DuplicateJob": ("j1", "ready", "taken"),
    "JobFailed": ("j1", "dead_letter", "boom"),
    "LeaseLost": ("j1", 7, "expired"),
    "FencedBlockBusy": ("j2", "j1"),
    "InvalidTransition": ("j1", "done", "cancel"),
    "WaitTimeout": ("j1", 1.5),
    "TimeLimitExceeded": ("j1", "tasks.add", 2.0, "cut off"),
    "NotQuarantined": ("x.json", 2),
}


def make(cls: type[BaseException]) -> BaseException:
    return cls(*_ARGS.get(cls.__name__, ("something went wrong",)))


def test_the_tree_holds_the_classes_that_used_to_live_elsewhere() -> None:
    names = {cls.__name__ for cls in ERROR_CLASSES}
    assert {"WorkerCrashed", "AppError", "ConfigError", "PoolFailed", "NotQuarantined"} <= names


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_class_is_exported_from_jobspool(cls: type[BaseException]) -> None:
    assert cls.__name__ in jobspool.__all__
    assert getattr(jobspool, cls.__name__) is cls
    assert cls.__name__ in errors.__all__


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_class_is_a_jobspool_error_or_a_warning(cls: type[BaseException]) -> None:
    assert issubclass(cls, JobspoolError) or issubclass(cls, Warning)


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_class_has_a_raised_when_docstring(cls: type[BaseException]) -> None:
    assert (cls.__doc__ or "").startswith(("Raised ", "Warned "))


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_round_trips_pickle_with_its_message_and_attributes(
        cls: type[BaseException]) -> None:
    err = make(cls)
    err.__dict__["extra"] = 1  # state set after construction survives too
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == str(err)
    assert back.__dict__ == err.__dict__


def test_old_import_paths_still_name_the_same_classes() -> None:
    from jobspool.app import AppError
    from jobspool.queue.pool import PoolFailed
    from jobspool.queue.worker import WorkerCrashed
    from jobspool.recovery.quarantine import NotQuarantined

    assert (AppError, PoolFailed, WorkerCrashed, NotQuarantined) == (
        errors.AppError, errors.PoolFailed, errors.WorkerCrashed, errors.NotQuarantined)


def test_configuration_errors_share_one_base() -> None:
    for cls in (errors.AppError, errors.PolicyError, errors.ScheduleError):
        assert issubclass(cls, errors.ConfigError)


def test_a_worker_without_handlers_raises_config_error(spool: Spool) -> None:
    with pytest.raises(errors.ConfigError, match="at least one handler"):
        Worker(spool, {})
    with pytest.raises(errors.ConfigError, match="'nope'"):
        Worker(spool, {"tasks.add": lambda job: None}, kinds=["nope"])
