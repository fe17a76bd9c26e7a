// jobspool dashboard: short polling of /api/overview, updating the page in place.
// Everything from the server is written with textContent or as SVG attributes, never as
// HTML, so a job kind, worker name or error holding markup stays text.
"use strict";
(function () {
  var SVG = "http://www.w3.org/2000/svg";
  var STATES = ["prepared", "ready", "leased", "retryable", "completed", "dead_letter", "canceled"];
  var body = document.body;
  var QUIET = 30;  // data.LIVE_SECONDS
  var every = parseInt(body.getAttribute("data-poll-ms") || "3000", 10);

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function pick(doc, path) {
    return path.split(".").reduce(function (o, k) { return o == null ? o : o[k]; }, doc);
  }

  function age(s) {
    if (s === null || s === undefined) return "-";
    if (s < 120) return Math.round(s) + " s";
    if (s < 7200) return Math.round(s / 60) + " min";
    if (s < 172800) return (s / 3600).toFixed(1) + " h";
    return (s / 86400).toFixed(1) + " d";
  }

  function jobLink(id, text) {
    var a = el("a", text);
    a.href = "/job/" + encodeURIComponent(id);
    return a;
  }

  function drawChart(chart) {
    var svg = document.getElementById("chart");
    if (!svg || !chart) return;
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.setAttribute("viewBox", "0 0 " + chart.width + " " + chart.height);
    chart.bars.forEach(function (b) {
      var r = document.createElementNS(SVG, "rect");
      r.setAttribute("x", b.x); r.setAttribute("y", b.y);
      r.setAttribute("width", b.w); r.setAttribute("height", b.h);
      r.setAttribute("class", "bar bar-" + (b.series === "failed" ? "failed" : "completed"));
      var t = document.createElementNS(SVG, "title");
      t.textContent = b.title;
      r.appendChild(t);
      svg.appendChild(r);
    });
  }

  function fillKinds(byKind, pending) {
    var tbody = document.querySelector("#kind-counts tbody");
    if (!tbody) return;
    var rows = Object.keys(byKind).sort();
    tbody.textContent = "";
    if (!rows.length) { var tr0 = el("tr"); var td0 = el("td", pending ? "counting jobs per kind\u2026" : "no jobs", "muted"); td0.colSpan = 8; tr0.appendChild(td0); tbody.appendChild(tr0); return; }
    rows.forEach(function (kind) {
      var tr = el("tr"), th = el("th"), a = el("a", kind);
      a.href = "/jobs/ready?kind=" + encodeURIComponent(kind);
      th.appendChild(a); tr.appendChild(th);
      STATES.forEach(function (s) {
        var n = byKind[kind][s] || 0, td = el("td", n ? null : 0, "num");
        if (n) {
          var link = el("a", n);
          link.href = "/jobs/" + s + "?kind=" + encodeURIComponent(kind);
          td.appendChild(link);
        }
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
    });
  }

  function fillWorkers(workers) {
    var tbody = document.querySelector("#workers tbody");
    if (!tbody) return;
    tbody.textContent = "";
    if (!workers.length) { var tr0 = el("tr"); var td0 = el("td", "no live workers", "muted"); td0.colSpan = 6; tr0.appendChild(td0); tbody.appendChild(tr0); return; }
    workers.forEach(function (w) {
      var tr = el("tr"), name = el("td");
      name.appendChild(el("code", w.owner));
      if (!w.publishing) name.appendChild(el("span", " (no metrics)", "muted"));
      else if (w.quiet) name.appendChild(el("span", " (quiet for " + QUIET + " s+)", "muted"));
      tr.appendChild(name);
      ["claimed", "completed", "retried", "dead_lettered"].forEach(function (k) {
        tr.appendChild(el("td", w.publishing ? (w.counters[k] || 0) : "", "num"));
      });
      var run = el("td");
      if (!w.running.length) run.appendChild(el("span", "idle", "muted"));
      w.running.slice(0, 4).forEach(function (r) {
        var a = jobLink(r.id, r.kind + " " + r.id);
        if (r.expired) a.className = "expired";
        run.appendChild(a); run.appendChild(document.createTextNode(" "));
      });
      var total = w.running_total === undefined ? w.running.length : w.running_total;
      if (total > 4) {
        run.appendChild(el("span", "and " + (total - 4) + " more leased", "muted"));
      }
      tr.appendChild(run);
      tbody.appendChild(tr);
    });
  }

  function fillHealth(h) {
    var box = document.getElementById("health");
    if (!box) return;
    box.className = "card health health-" + (h.status === "ok" ? "ok" : "degraded");
    document.getElementById("health-status").textContent = h.status;
    var ul = document.getElementById("health-reasons");
    ul.textContent = "";
    h.reasons.forEach(function (r) {
      var li = el("li");
      li.appendChild(el("code", r.code));
      li.appendChild(document.createTextNode(" " + r.message));
      ul.appendChild(li);
    });
  }

  function apply(doc) {
    document.querySelectorAll("[data-count]").forEach(function (e) {
      var v = doc.counts[e.getAttribute("data-count")];
      if (v !== undefined) e.textContent = String(v);
    });
    document.querySelectorAll("[data-field]").forEach(function (e) {
      var f = e.getAttribute("data-field");
      var v = pick(doc, f);
      e.textContent = f === "oldest_due_age" ? age(v) : (v === null || v === undefined ? "-" : String(v));
    });
    if (body.getAttribute("data-page") === "overview") {
      fillHealth(doc.health);
      fillKinds(doc.by_kind, doc.by_kind_pending);
      fillWorkers(doc.workers);
      if (doc.throughput) drawChart(doc.throughput.chart);
    }
    var stamp = document.getElementById("updated-at");
    if (stamp) stamp.textContent = "updated " + new Date().toLocaleTimeString();
    body.setAttribute("data-polls", String(parseInt(body.getAttribute("data-polls") || "0", 10) + 1));
  }

  function applyJob(job) {
    document.querySelectorAll("[data-job]").forEach(function (e) {
      var f = e.getAttribute("data-job");
      if (f === "state") { e.textContent = job.status || job.state; e.className = "pill state-" + job.state; }
      else if (f === "attempts") e.textContent = job.attempts + " of " + job.max_attempts;
      else if (job[f] !== undefined) e.textContent = String(job[f]);
    });
  }

  function get(url, then) {
    return fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (d) { if (d) then(d); })
      .catch(function () { /* the server restarted or the network blinked: try next tick */ });
  }

  function tick() {
    if (document.hidden) return;
    get("/api/overview", apply);
    var jobId = body.getAttribute("data-job-id");
    if (jobId) get("/api/job/" + encodeURIComponent(jobId), applyJob);
  }

  if (every > 0) setInterval(tick, every);
})();
