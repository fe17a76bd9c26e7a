"""The dashboard's pages, JSON endpoints and actions (every action a POST with a CSRF token)."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from jobspool.dashboard import actions, data, security, throttle
from jobspool.dashboard.web import (
    FormTooLarge,
    age_text,
    in_thread,
    json_response,
    read_form,
    redirect,
    safe_next,
)
from jobspool.errors import InvalidJob, JobspoolError, one_line, undecodable_escaped
from jobspool.queue.job import validate_job_id, validate_kind
from jobspool.queue.states import ALL_STATES, JobState

if TYPE_CHECKING:
    from jobspool.dashboard.web import Dashboard

log = logging.getLogger("jobspool.dashboard")

Handler = Callable[[Request], Awaitable[Response]]
_MAX_TEXT = 200


def routes(dash: Dashboard) -> list[Route]:
    """Every route of the dashboard, bound to `dash`."""

    # ------------------------------------------------------------ pages

    async def overview(request: Request) -> Response:
        doc = await in_thread(dash.snapshot)
        return dash.render(request, "overview.html", doc=doc, states=ALL_STATES,
                           age_text=age_text, nav=doc["counts"], live_seconds=data.LIVE_SECONDS)

    async def api_overview(request: Request) -> Response:
        return json_response(await in_thread(dash.snapshot))

    def _filters(request: Request, state_name: str) -> tuple[JobState, dict[str, Any]]:
        try:
            state = JobState(state_name)
        except ValueError:
            raise NotFound(f"no state named {state_name!r}") from None
        q = request.query_params
        kind = q.get("kind") or None
        text = (q.get("q") or "")[:_MAX_TEXT] or None
        after = q.get("after") or None
        try:
            if kind is not None:
                validate_kind(kind)
            if after is not None:
                validate_job_id(after)
        except InvalidJob as exc:
            raise BadRequest(str(exc)) from None
        return state, {"kind": kind, "text": text, "cursor": after}

    async def job_list(request: Request) -> Response:
        try:
            state, filters = _filters(request, request.path_params["state"])
        except BadRequest as exc:
            return dash.render(request, "error.html", 400, message=str(exc), nav=None)
        got = await in_thread(lambda: data.page(dash.spool, state, **filters))
        doc = await in_thread(dash.snapshot)
        kinds = sorted(doc["by_kind"])
        base = {k: v for k, v in (("kind", filters["kind"]), ("q", filters["text"])) if v}
        next_url = (f"/jobs/{state.value}?{urlencode({**base, 'after': got.next_cursor})}"
                    if got.next_cursor else None)
        dead_kind = filters["kind"] if state is JobState.DEAD_LETTER else None
        return dash.render(request, "list.html", state=state, page=got, filters=filters,
                           kinds=kinds, next_url=next_url, nav=doc["counts"],
                           dead_kind=dead_kind, states=ALL_STATES,
                           first_url=f"/jobs/{state.value}?{urlencode(base)}")

    async def api_jobs(request: Request) -> Response:
        try:
            state, filters = _filters(request, request.path_params["state"])
        except BadRequest as exc:
            return json_response({"error": str(exc)}, 400)
        got = await in_thread(lambda: data.page(dash.spool, state, **filters))
        return json_response({"state": state.value, "total": got.total,
                              # `status` as `list --json` gives it: a delayed job is
                              # "scheduled", not a failing retry.
                              "jobs": [_encoded({**j.to_dict(), "status": j.status})
                                       for j in got.jobs],
                              "next": got.next_cursor, "scanned": got.scanned,
                              "truncated": got.truncated})

    async def _job(request: Request) -> Any:
        job_id = request.path_params["job_id"]
        try:
            validate_job_id(job_id)
        except InvalidJob as exc:
            raise NotFound(str(exc)) from None
        job = await in_thread(data.get_job, dash.spool, job_id)
        if job is None:
            raise NotFound(f"no job {job_id} (finished long ago and pruned, or never enqueued)")
        return job

    async def job_page(request: Request) -> Response:
        job = await _job(request)
        doc = await in_thread(dash.snapshot)
        return dash.render(request, "job.html", job=job, timeline=data.timeline(job),
                           traceback=getattr(job, "traceback", None), now=doc["now"],
                           can_requeue=data.can_requeue(job), can_cancel=data.can_cancel(job),
                           nav=doc["counts"], states=ALL_STATES)

    async def api_job(request: Request) -> Response:
        job = await _job(request)
        d = job.to_dict()
        d["status"] = job.status
        d["traceback"] = getattr(job, "traceback", None)
        return json_response(d)

    async def quarantine_page(request: Request) -> Response:
        entries = await in_thread(_quarantine_entries, dash.spool)
        doc = await in_thread(dash.snapshot)
        return dash.render(request, "quarantine.html", entries=entries,
                           can_restore=actions.can_restore(), nav=doc["counts"],
                           states=ALL_STATES)

    # ------------------------------------------------------------ actions

    def action(run: Callable[[Request, dict[str, str]], Awaitable[Response]]) -> Handler:
        """Wrap a POST handler: read-only refusal, form size, CSRF, operator errors."""

        async def handler(request: Request) -> Response:
            if dash.read_only:
                return dash.render(request, "error.html", 403, nav=None,
                                   message="this dashboard is read-only: actions are disabled")
            try:
                form = await read_form(request)
            except FormTooLarge:
                return dash.render(request, "error.html", 413, nav=None,
                                   message="form too large")
            if not dash.guard.csrf_ok(request.state.sid, form.get(security.CSRF_FIELD)):
                return dash.render(request, "error.html", 403, nav=None,
                                   message="missing or stale CSRF token: reload the page "
                                           "and try again")
            try:
                # Shielded: an action under way when the server stops (its lock taken, its
                # thread running) finishes and answers. Cut off at its await, it answered
                # 500 while its thread carried it out all the same.
                with anyio.CancelScope(shield=True):
                    await in_thread(actions.lock_within_reach, dash.spool)
                    response = await run(request, form)
            except actions.ActionError as exc:
                return redirect(safe_next(form.get("next")), str(exc))
            return response

        return handler

    def back(form: dict[str, str], job_id: str) -> str:
        """Where a one-job action returns: the page it came from (a filtered list keeps its
        filters), else the job's own page."""
        return safe_next(form["next"]) if form.get("next") else f"/job/{quote(job_id)}"

    async def do_requeue(request: Request, form: dict[str, str]) -> Response:
        job = await _job(request)
        note = await in_thread(actions.requeue, dash.spool, job.id)
        return redirect(back(form, job.id), note)

    async def do_cancel(request: Request, form: dict[str, str]) -> Response:
        job = await _job(request)
        note = await in_thread(actions.cancel, dash.spool, job.id)
        return redirect(back(form, job.id), note)

    def _until(text: str) -> float:
        """The confirmed listing's bound (see `actions.requeue_dead`)."""
        try:
            until = float(text)
        except ValueError:
            until = math.nan
        if not math.isfinite(until) or until < 0:  # only a forged form sends these
            raise actions.ActionError("the confirmation is incomplete (no listing to act "
                                      "on): open the dead letters and confirm again")
        return until

    def bulk(verb: str, run: Callable[..., str]) -> Handler:
        async def do(request: Request, form: dict[str, str]) -> Response:
            kind = form.get("kind", "")
            try:
                validate_kind(kind)
            except InvalidJob as exc:
                raise actions.ActionError(str(exc)) from None
            back = f"/jobs/dead_letter?{urlencode({'kind': kind})}"
            if form.get("confirm") != "yes":
                ids, until = await in_thread(actions.dead_of_kind, dash.spool, kind)
                return dash.render(request, "confirm.html", verb=verb, kind=kind, ids=ids,
                                   until=None if until is None else repr(until),
                                   action=request.url.path, back=back, nav=None)
            until = _until(form.get("until", ""))
            note = await in_thread(run, dash.spool, kind, until)
            return redirect(back, note)

        return action(do)

    async def do_restore(request: Request, form: dict[str, str]) -> Response:
        name = request.path_params["name"]
        note = await in_thread(actions.restore, dash.spool, name)
        return redirect("/quarantine", note)

    # ------------------------------------------------------------ login

    async def login_page(request: Request) -> Response:
        if dash.guard.token is None:
            return RedirectResponse("/", status_code=303)
        return dash.render(request, "login.html", next=safe_next(request.query_params.get("next")),
                           error=None, nav=None)

    async def login(request: Request) -> Response:
        if dash.guard.token is None:
            return RedirectResponse("/", status_code=303)
        try:
            form = await read_form(request)
        except FormTooLarge:
            return dash.render(request, "error.html", 413, message="form too large", nav=None)
        nxt = safe_next(form.get("next"))
        if not dash.guard.csrf_ok(request.state.sid, form.get(security.CSRF_FIELD)):
            return dash.render(request, "login.html", 403, next=nxt, nav=None,
                               error="stale form: try again")
        client = security.client_of(request)
        wait = dash.guard.throttle.wait(client)
        if wait > 0:
            # Before the token is looked at: a right guess must not show while throttled.
            after = throttle.retry_after(wait)
            held = dash.render(request, "login.html", 429, next=nxt, nav=None,
                               error=f"too many wrong tokens from your address: try again "
                                     f"in {after} s")
            held.headers["retry-after"] = after
            return held
        if not dash.guard.token_ok(form.get("token")):
            dash.guard.throttle.failed(client)
            return dash.render(request, "login.html", 401, next=nxt, nav=None,
                               error="wrong token")
        dash.guard.throttle.passed(client)
        response = RedirectResponse(nxt, status_code=303)
        response.set_cookie(security.AUTH_COOKIE, dash.guard.auth_cookie(), path="/",
                            httponly=True, samesite="strict")
        return response

    async def logout(request: Request) -> Response:
        try:
            form = await read_form(request)
        except FormTooLarge:
            form = {}
        if not dash.guard.csrf_ok(request.state.sid, form.get(security.CSRF_FIELD)):
            return dash.render(request, "error.html", 403, nav=None,
                               message="missing or stale CSRF token")
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(security.AUTH_COOKIE, path="/")
        return response

    def errors(handler: Handler) -> Handler:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except NotFound as exc:
                return problem(request, 404, str(exc))
            except (JobspoolError, OSError) as exc:
                # The spool went away or refused (deleted, unmounted, the database down):
                # one line on a page, as the CLI would say it, not a bare 500.
                log.warning("dashboard: %s %s: %s", request.method, request.url.path,
                            one_line(exc))
                return problem(request, 503, f"the spool cannot be read: {one_line(exc)}")

        return wrapped

    def problem(request: Request, status: int, message: str) -> Response:
        if request.url.path.startswith("/api/"):
            return json_response({"error": message}, status)
        return dash.render(request, "error.html", status, message=message, nav=None)

    return [
        Route("/", errors(overview), methods=["GET"]),
        Route("/api/overview", errors(api_overview), methods=["GET"]),
        Route("/jobs/{state}", errors(job_list), methods=["GET"]),
        Route("/api/jobs/{state}", errors(api_jobs), methods=["GET"]),
        Route("/job/{job_id}", errors(job_page), methods=["GET"]),
        Route("/api/job/{job_id}", errors(api_job), methods=["GET"]),
        Route("/job/{job_id}/requeue", errors(action(do_requeue)), methods=["POST"]),
        Route("/job/{job_id}/cancel", errors(action(do_cancel)), methods=["POST"]),
        Route("/dead/requeue", errors(bulk("requeue", actions.requeue_dead)), methods=["POST"]),
        Route("/dead/purge", errors(bulk("purge", actions.purge_dead)), methods=["POST"]),
        Route("/quarantine", errors(quarantine_page), methods=["GET"]),
        Route("/quarantine/{name}/restore", errors(action(do_restore)), methods=["POST"]),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
    ]


class NotFound(Exception):
    """Raised by a handler for a job or state that does not exist (404)."""


class BadRequest(Exception):
    """Raised by a handler for a malformed filter (400)."""


def _quarantine_entries(spool: Any) -> list[dict[str, Any]]:
    from jobspool.queue.journal import journal_of
    from jobspool.recovery.quarantine import quarantined_files, read_reason

    out = []
    core = journal_of(spool) or spool  # a file spool's journal; another store as it is
    for name in quarantined_files(core):
        try:
            reason: dict[str, object] = read_reason(core, name)
        except (OSError, ValueError):
            reason = {}
        try:
            size = (spool.root / "quarantine" / name).stat().st_size
        except OSError:
            size = None
        shown = undecodable_escaped(name)
        # A name that is not UTF-8 (`bad\xffname.json`) cannot travel in a URL, nor be a
        # job's once restored: shown escaped, with no restore button. It broke the page.
        out.append({"name": shown, "restorable": shown == name,
                    "reason": undecodable_escaped(str(reason.get("reason") or "")) or None,
                    "source": reason.get("source"), "at": reason.get("quarantined_at"),
                    "size": size})
    return out


def _encoded(doc: dict[str, Any]) -> Any:
    """One job of a listing, encoded on its own: a payload or result as deep as enqueue
    takes (253 levels) sat two levels deeper in the listing than orjson writes, and
    `/api/jobs/<state>` was a 500 for the whole page."""
    fragment = getattr(orjson, "Fragment", None)  # orjson 3.9.15 and later
    if fragment is None:
        return doc
    try:
        return fragment(orjson.dumps(doc, default=str))
    except TypeError:  # a name that is not UTF-8: `json_response` makes it safe
        return doc
