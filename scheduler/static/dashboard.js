// truba's dashboard: polls the scheduler's JSON API every second and draws what it finds.
// No library, no resource from elsewhere: tables and small SVG line charts.
// With a token on the scheduler, open the page as /#token=SECRET: the fragment never reaches the
// server; the token is kept in this tab's sessionStorage and sent as a bearer header.
"use strict";

const REFRESH_MS = 1000;
const COLORS = ["#2f6fdf", "#2e9d5b", "#d0443c", "#c98a12", "#8a4fd0", "#1a9aa0", "#d05f9a", "#6b7585"];

(function takeToken() {
  const match = location.hash.match(/token=([^&]+)/);
  if (match) {
    sessionStorage.setItem("truba-token", decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
})();

async function api(path) {
  const token = sessionStorage.getItem("truba-token");
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const response = await fetch(path, { headers, cache: "no-store" });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(`${path}: ${response.status} ${body.error || response.statusText}`);
  }
  return response.json();
}

const num = (v) => Number(v || 0);
const state = (job) => (job.state || "JOB_STATE_UNSPECIFIED").replace("JOB_STATE_", "").toLowerCase();
const fmt = (v, digits = 0) =>
  Number(v).toLocaleString(undefined, { maximumFractionDigits: digits, minimumFractionDigits: 0 });

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "style") Object.assign(node.style, value); // CSSOM: allowed by the page's CSP
    else node[key] = value;
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(child));
  return node;
}

function slotBar(job, scale) {
  const held = num(job.assigned_slots);
  const share = num(job.fair_share);
  const bar = el("div", { class: "bar", title: `${held} held, fair share ${fmt(share, 1)}` });
  bar.append(el("div", { class: "held", style: { width: `${(100 * held) / scale}%` } }));
  bar.append(el("div", { class: "share", style: { left: `${Math.min(100, (100 * share) / scale)}%` } }));
  bar.append(el("span", {}, `${held} / ${fmt(share, 1)}`));
  return bar;
}

function lastRate(points) {
  return points && points.length ? points[points.length - 1].rate : 0;
}

function renderJobs(jobs, history) {
  const body = document.querySelector("#jobs tbody");
  const scale = Math.max(1, ...jobs.map((j) => Math.max(num(j.assigned_slots), num(j.fair_share))));
  body.replaceChildren(
    ...jobs.map((job) => {
      const c = job.counts || {};
      return el(
        "tr",
        { id: "job-" + job.id },
        el("td", {}, el("a", { href: "#job/" + job.id }, job.id)),
        el("td", {}, job.name || ""),
        el("td", {}, state(job)),
        el("td", { class: "n" }, fmt(num(job.importance), 2)),
        el("td", {}, slotBar(job, scale)),
        el("td", { class: "n backlog" }, fmt(num(c.backlog))),
        el("td", { class: "n running" }, fmt(num(c.running))),
        el("td", { class: "n done" }, fmt(num(c.done))),
        el("td", { class: "n" + (num(c.failed) ? " failed" : "") }, fmt(num(c.failed))),
        el("td", { class: "n rate" }, fmt(lastRate(history[job.id]), 1)),
        el("td", { class: "problem" }, job.problem || "")
      );
    })
  );
  document.getElementById("no-jobs").hidden = jobs.length > 0;
}

const outcome = (run) => (run && run.outcome ? run.outcome.replace("RUN_OUTCOME_", "").toLowerCase() : "—");

function renderSchedules(schedules) {
  const body = document.querySelector("#schedules tbody");
  const now = Date.now() / 1000;
  body.replaceChildren(
    ...schedules.map((s) => {
      const last = s.last_run;
      const kind = outcome(last);
      const active = (s.state || "").endsWith("ACTIVE");
      return el(
        "tr",
        { id: "schedule-" + s.id },
        el("td", {}, s.id),
        el("td", {}, s.name || ""),
        el("td", {}, s.handler || ""),
        el("td", {}, num(s.every) ? `every ${fmt(num(s.every), 2)} s` : `cron ${s.cron || ""}`),
        el("td", { class: "state" }, active ? "active" : "paused"),
        el("td", { class: "n runs" }, fmt(num(s.runs))),
        el("td", { class: "outcome " + kind, title: (last && last.error) || "" }, kind),
        el("td", { class: "n" }, last && last.ended ? `${fmt(num(last.duration) * 1000, 1)} ms` : "—"),
        el("td", { class: "n next" }, active ? `${fmt(Math.max(0, num(s.next_due) - now), 1)} s` : "—"),
        el("td", {}, el("a", { href: "#job/" + s.job_id }, s.job_id || ""))
      );
    })
  );
  document.getElementById("no-schedules").hidden = schedules.length > 0;
}

function renderDaemons(daemons) {
  const body = document.querySelector("#daemons tbody");
  const now = Date.now() / 1000;
  body.replaceChildren(
    ...daemons.map((d) => {
      const busy = (d.stats || []).reduce((sum, s) => sum + num(s.busy_slots), 0);
      const slots = num(d.slots);
      const held = (d.assigned || []).map((a) => `${a.job_id} (${num(a.slots)})`).join(", ");
      const bar = el("div", { class: "bar", title: `${busy} of ${slots} slots busy` });
      bar.append(el("div", { class: "held", style: { width: `${slots ? (100 * busy) / slots : 0}%` } }));
      bar.append(el("span", {}, `${busy} / ${slots}`));
      return el(
        "tr",
        { id: "daemon-" + d.daemon_id },
        el("td", {}, d.daemon_id),
        el("td", {}, `${d.hostname || ""} (pid ${d.pid || "?"})`),
        el("td", { class: "n" }, fmt(slots)),
        el("td", {}, bar),
        el("td", {}, held || "—"),
        el("td", { class: "n" }, `${fmt(Math.max(0, now - num(d.last_seen)), 1)} s ago`),
        el("td", {}, d.draining ? "draining" : "serving")
      );
    })
  );
  document.getElementById("no-daemons").hidden = daemons.length > 0;
}

// A line chart of several series [{name, color, points: [[t, v], ...]}] over the last minutes;
// a null value is a gap in its line (e.g. no outcome, so no latency, in those seconds).
function chart(svg, series, { digits = 0 } = {}) {
  const width = svg.clientWidth || 300;
  const height = svg.clientHeight || 140;
  const pad = { left: 44, right: 6, top: 6, bottom: 16 };
  const all = series.flatMap((s) => s.points).filter((p) => p[1] !== null && p[1] !== undefined);
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  if (!all.length) {
    add("text", { x: pad.left, y: height / 2 }, "no data yet");
    return;
  }
  const t1 = Math.max(...all.map((p) => p[0]));
  const t0 = Math.min(t1 - 60, ...all.map((p) => p[0]));
  const top = Math.max(1e-9, ...all.map((p) => p[1])) * 1.1;
  const x = (t) => pad.left + ((t - t0) / Math.max(1, t1 - t0)) * (width - pad.left - pad.right);
  const y = (v) => height - pad.bottom - (v / top) * (height - pad.top - pad.bottom);
  add("line", { class: "axis", x1: pad.left, y1: y(0), x2: width - pad.right, y2: y(0) });
  add("line", { class: "axis", x1: pad.left, y1: pad.top, x2: pad.left, y2: y(0) });
  add("text", { x: 2, y: pad.top + 8 }, fmt(top / 1.1, digits));
  add("text", { x: 2, y: y(0) }, "0");
  add("text", { x: pad.left, y: height - 3 }, `${fmt((t1 - t0) / 60, 1)} min`);
  add("text", { x: width - pad.right - 22, y: height - 3 }, "now");
  series.forEach((s, i) => {
    let d = "";
    let pen = "M";
    for (const [t, v] of s.points) {
      if (v === null || v === undefined) {
        pen = "M";
        continue;
      }
      d += `${pen}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      pen = "L";
    }
    if (!d) return;
    add("path", { d, fill: "none", stroke: s.color || COLORS[i % COLORS.length], "stroke-width": 1.6 });
  });
  if (series.length > 1 && series.length <= 8) {
    series.forEach((s, i) => {
      const label = add("text", { x: pad.left + 6 + i * 90, y: pad.top + 8 }, s.name.slice(0, 14));
      label.style.fill = s.color || COLORS[i % COLORS.length];
    });
  }
}

function seriesOf(history, field) {
  return Object.entries(history).map(([jobId, points], i) => ({
    name: jobId,
    color: COLORS[i % COLORS.length],
    points: points.map((p) => [p.at, p[field]]),
  }));
}

function renderOverviewCharts(history) {
  chart(document.getElementById("chart-rate"), seriesOf(history, "rate"), { digits: 1 });
  chart(document.getElementById("chart-latency"), seriesOf(history, "latency_p99"), { digits: 3 });
  chart(document.getElementById("chart-backlog"), seriesOf(history, "backlog"));
  chart(document.getElementById("chart-slots"), seriesOf(history, "assigned_slots"));
}

// The job's outcome latency so far (the client's histogram), as "12.5 ms / 1.20 s".
function latencyFact(counts) {
  const seconds = (v) => (v < 1 ? `${fmt(v * 1000, 1)} ms` : `${fmt(v, 2)} s`);
  const p50 = num(counts.outcome_latency_p50);
  return p50 ? `${seconds(p50)} / ${seconds(num(counts.outcome_latency_p99))}` : "—";
}

function renderJob(job, points) {
  const c = job.counts || {};
  const s = job.settings || {};
  document.getElementById("job-title").textContent = `${job.id}${job.name ? " — " + job.name : ""}`;
  const facts = [
    ["state", state(job)],
    ["handler", job.handler],
    ["importance", fmt(num(job.importance), 2)],
    ["slots held / fair share", `${num(job.assigned_slots)} / ${fmt(num(job.fair_share), 1)}`],
    ["submitted", fmt(num(c.submitted))],
    ["done / failed", `${fmt(num(c.done))} / ${fmt(num(c.failed))}`],
    ["running / backlog", `${fmt(num(c.running))} / ${fmt(num(c.backlog))}`],
    ["task time", num(c.service_time) ? `${fmt(num(c.service_time) * 1000, 1)} ms` : "—"],
    ["outcome latency p50 / p99", latencyFact(c)],
    ["preemption", (s.preemption || "").replace("PREEMPTION_", "").toLowerCase() || "graceful"],
    ["task timeout", num(s.task_timeout) ? `${num(s.task_timeout)} s` : "none"],
    ["max attempts", num(s.max_attempts) || "default"],
    ["problem", job.problem || "none"],
  ];
  document.getElementById("job-facts").replaceChildren(
    ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { id: "fact-" + k.replace(/\W+/g, "-") }, String(v))])
  );
  const at = (field) => points.map((p) => [p.at, p[field]]);
  chart(document.getElementById("job-rate"), [{ name: "tasks/s", points: at("rate") }], { digits: 1 });
  chart(
    document.getElementById("job-latency"),
    [
      { name: "p50", points: at("latency_p50") },
      { name: "p99", points: at("latency_p99") },
    ],
    { digits: 3 }
  );
  chart(document.getElementById("job-backlog"), [
    { name: "backlog", points: at("backlog") },
    { name: "running", points: at("running") },
  ]);
  chart(document.getElementById("job-slots"), [
    { name: "held", points: at("assigned_slots") },
    { name: "fair share", points: at("fair_share") },
  ]);
  chart(document.getElementById("job-time"), [{ name: "seconds", points: at("task_seconds") }], { digits: 3 });
}

// The job page's timeline: spans fetched incrementally (the newest end seen, less a margin for
// heartbeats still on their way), kept per job and drawn by timeline.js.
const TIMELINE_KEEP = 5000;
const TIMELINE_MARGIN = 10;
let timeline = { job: null, spans: new Map(), newest: 0, dropped: 0 };

async function refreshTimeline(jobId) {
  if (timeline.job !== jobId) timeline = { job: jobId, spans: new Map(), newest: 0, dropped: 0 };
  const since = timeline.newest ? timeline.newest - TIMELINE_MARGIN : 0;
  const first = !timeline.newest;
  const data = await api(`api/v1/jobs/${jobId}/timeline?since=${since}&limit=${TIMELINE_KEEP}`);
  for (const span of data.spans) {
    timeline.spans.set(`${span.daemon_id}/${span.slot}/${span.task_id}/${span.start}/${span.outcome}`, span);
    timeline.newest = Math.max(timeline.newest, span.end);
  }
  if (timeline.spans.size > TIMELINE_KEEP) {
    const newest = [...timeline.spans.entries()].sort((a, b) => a[1].end - b[1].end).slice(-TIMELINE_KEEP);
    timeline.spans = new Map(newest);
  }
  const spans = [...timeline.spans.values()];
  if (first) timeline.leftOut = num(data.left_out);
  const missing = num(data.dropped) + num(timeline.leftOut);
  const note = missing ? `· ${fmt(missing)} older or unreported attempts not shown` : "";
  document.getElementById("timeline-note").textContent = `· ${fmt(spans.length)} shown ${note}`;
  drawTimeline(document.getElementById("job-timeline"), spans, { follow: true });
}

async function refresh() {
  const route = location.hash.match(/^#job\/([a-z0-9]+)$/);
  const status = document.getElementById("status");
  try {
    const [{ jobs }, { daemons }, history, { schedules }] = await Promise.all([
      api("api/v1/jobs"),
      api("api/v1/daemons"),
      api("api/v1/history"),
      api("api/v1/schedules"),
    ]);
    const slots = daemons.reduce((sum, d) => sum + num(d.slots), 0);
    const busy = daemons.reduce((sum, d) => sum + (d.stats || []).reduce((a, s) => a + num(s.busy_slots), 0), 0);
    document.getElementById("summary").textContent =
      `${jobs.length} job(s) · ${daemons.length} daemon(s) · ${busy} of ${slots} slots busy`;
    document.getElementById("overview").hidden = Boolean(route);
    document.getElementById("job").hidden = !route;
    if (route) {
      const job = await api("api/v1/jobs/" + route[1]);
      renderJob(job, history[route[1]] || []);
      refreshDead(route[1]);
      await Promise.all([refreshTimeline(route[1]), refreshErrors(route[1])]);
    } else {
      renderJobs(jobs, history);
      renderSchedules(schedules);
      renderDaemons(daemons);
      renderOverviewCharts(history);
    }
    status.textContent = "updated " + new Date().toLocaleTimeString();
    status.classList.remove("stale");
  } catch (error) {
    status.textContent = String(error.message || error);
    status.classList.add("stale");
  }
}

window.addEventListener("hashchange", refresh);
refresh();
setInterval(refresh, REFRESH_MS);
