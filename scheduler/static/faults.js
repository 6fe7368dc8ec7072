// A job's failures on its page: its newest failed attempts (the daemons' heartbeats bring them;
// fetched at every refresh) and its dead letters (read through the brokers, so fetched every
// DEAD_REFRESH_MS at most, in the background: a slow broker never holds the page up).
// Uses api(), el(), num() and fmt() of dashboard.js.
"use strict";

const ERRORS_LIMIT = 50;
const DEAD_LIMIT = 100;
const DEAD_REFRESH_MS = 5000;
let deadFetch = { job: null, at: 0, busy: false };

const clockTime = (seconds) => new Date(seconds * 1000).toLocaleTimeString();
const words = (value, prefix) => (value || "").replace(prefix, "").toLowerCase().replace(/_/g, " ");

function errorCell(type, message) {
  const text = message ? `: ${message}` : "";
  return el("td", { class: "error", title: `${type || "error"}${text}` }, el("b", {}, type || "error"), text);
}

async function refreshErrors(jobId) {
  const data = await api(`api/v1/jobs/${jobId}/errors?limit=${ERRORS_LIMIT}`);
  const errors = data.errors || [];
  document.querySelector("#job-errors tbody").replaceChildren(
    ...errors.map((e) =>
      el(
        "tr",
        {},
        el("td", {}, clockTime(num(e.end))),
        el("td", { class: "task" }, e.task_id),
        el("td", { class: "n" }, String(num(e.attempt))),
        el("td", { class: "how" }, words(e.outcome, "")),
        el("td", {}, `${e.daemon_id} · ${num(e.slot)}`),
        errorCell(e.error, e.message)
      )
    )
  );
  document.getElementById("no-errors").hidden = errors.length > 0;
  document.getElementById("errors-note").textContent = errors.length ? `· the newest ${errors.length}` : "";
}

function renderDead(data) {
  const letters = data.dead_letters || [];
  document.querySelector("#job-dead tbody").replaceChildren(
    ...letters.map((d) =>
      el(
        "tr",
        {},
        el("td", { class: "task" }, d.task_id || "(unreadable)"),
        el("td", { class: "reason" }, words(d.reason, "DEAD_LETTER_REASON_")),
        el("td", { class: "n" }, num(d.attempts) ? String(num(d.attempts)) : "—"),
        el("td", {}, d.broker || ""),
        el("td", {}, d.daemon_id || "—"),
        errorCell(d.error_type, d.error_message)
      )
    )
  );
  document.getElementById("no-dead").hidden = letters.length > 0;
  const notes = [`${fmt(letters.length)} shown`];
  if (data.truncated) notes.push(`more are kept (the first ${DEAD_LIMIT} per broker shown)`);
  if (num(data.kept_until)) notes.push(`kept until ${new Date(num(data.kept_until) * 1000).toLocaleString()}`);
  for (const broker of data.unreachable || []) notes.push(`not read: ${broker}`);
  document.getElementById("dead-note").textContent = "· " + notes.join(" · ");
}

function refreshDead(jobId) {
  const now = Date.now();
  if (deadFetch.busy || (deadFetch.job === jobId && now - deadFetch.at < DEAD_REFRESH_MS)) return;
  if (deadFetch.job !== jobId) {
    document.querySelector("#job-dead tbody").replaceChildren();
    document.getElementById("dead-note").textContent = "· reading…";
  }
  deadFetch = { job: jobId, at: now, busy: true };
  api(`api/v1/jobs/${jobId}/dead?limit=${DEAD_LIMIT}`)
    .then((data) => {
      if (deadFetch.job === jobId) renderDead(data);
    })
    .catch((error) => {
      document.getElementById("dead-note").textContent = "· " + String(error.message || error);
    })
    .finally(() => {
      deadFetch.busy = false;
    });
}
