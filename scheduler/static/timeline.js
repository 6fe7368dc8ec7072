// truba's timeline: a lane per daemon and slot, a bar per task attempt from its start to its end,
// coloured by how it ended (or by job when several jobs are drawn), with preemptions, failures,
// retries and give-ups marked, and a legend. Hover a bar for its task, times and outcome; the
// mouse wheel zooms, dragging pans, a double click shows everything again.
// Used by the dashboard's job page and inlined by `truba timeline -o FILE.html`: no library, no
// resource from elsewhere, no inline style (the dashboard's Content-Security-Policy forbids it).
"use strict";

const TIMELINE_OUTCOMES = {
  ok: { color: "#2e9d5b", label: "ok" },
  error: { color: "#d0443c", label: "failed (error)", mark: "x" },
  retried: { color: "#e59a1c", label: "retried", mark: "r" },
  timeout: { color: "#8a4fd0", label: "timed out", mark: "x" },
  crashed: { color: "#7a3b12", label: "slot crashed / memory", mark: "x" },
  preempted: { color: "#2f6fdf", label: "preempted (put back)", mark: "p" },
  gave_up: { color: "#111111", label: "given up", mark: "g" },
  slot_taken: { color: "#6b7585", label: "slot taken from the job", mark: "t" },
};
const TIMELINE_JOB_COLORS = ["#2f6fdf", "#2e9d5b", "#d0443c", "#c98a12", "#8a4fd0", "#1a9aa0", "#d05f9a", "#6b7585"];
const TIMELINE_NS = "http://www.w3.org/2000/svg";

function timelineLaneKey(span) {
  return `${span.daemon_id} · slot ${span.slot}`;
}

function timelineClock(seconds, step) {
  const date = new Date(seconds * 1000);
  const hms = date.toTimeString().slice(0, 8);
  return step < 1 ? `${hms}.${String(date.getMilliseconds()).padStart(3, "0")}` : hms;
}

function timelineStep(range, pixels) {
  const want = range / Math.max(1, pixels / 90);
  const steps = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600];
  return steps.find((s) => s >= want) || 7200;
}

// Draws `spans` ([{job_id?, daemon_id, slot, task_id, start, end, outcome, attempt, error}]) into
// `svg`. The view (zoom) is kept on the element between calls; `options.follow` keeps an
// unzoomed view on the newest spans (the dashboard's live page).
function drawTimeline(svg, spans, options = {}) {
  const width = svg.clientWidth || options.width || 900;
  const jobs = [...new Set(spans.map((s) => s.job_id || ""))];
  const byJob = jobs.length > 1;
  const lanes = [...new Set(spans.map(timelineLaneKey))].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
  const laneHeight = lanes.length > 40 ? 10 : 18;
  const pad = { left: 150, right: 12, top: 44, bottom: 22 };
  const height = pad.top + Math.max(1, lanes.length) * laneHeight + pad.bottom;
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.style.height = `${height}px`;
  const add = (parent, tag, attrs, text) => {
    const node = document.createElementNS(TIMELINE_NS, tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    parent.append(node);
    return node;
  };
  if (!spans.length) {
    add(svg, "text", { x: pad.left, y: pad.top, class: "tl-empty" }, "no task attempt reported yet");
    return;
  }
  let lo = Infinity;
  let hi = -Infinity;
  for (const s of spans) {
    lo = Math.min(lo, s.start);
    hi = Math.max(hi, s.end);
  }
  hi = Math.max(hi, lo + 0.001);
  let view = svg.truba_view;
  const margin = (hi - lo) * 0.01; // marks at either end stay in sight
  if (!view || (options.follow && !view.zoomed)) view = { t0: lo - margin, t1: hi + margin, zoomed: false };
  svg.truba_view = view;
  svg.truba_redraw = () => drawTimeline(svg, spans, options);
  const inner = width - pad.left - pad.right;
  const x = (t) => pad.left + ((t - view.t0) / (view.t1 - view.t0)) * inner;
  const laneIndex = new Map(lanes.map((lane, i) => [lane, i]));
  const laneY = (span) => pad.top + laneIndex.get(timelineLaneKey(span)) * laneHeight;

  // legend: outcomes (and jobs when several)
  const legend = add(svg, "g", { class: "tl-legend" });
  let lx = 4;
  const entries = Object.entries(TIMELINE_OUTCOMES).map(([key, o]) => [o.color, o.label, key]);
  if (byJob) jobs.forEach((job, i) => entries.unshift([TIMELINE_JOB_COLORS[i % TIMELINE_JOB_COLORS.length], "job " + job, ""]));
  for (const [color, label] of entries) {
    add(legend, "rect", { x: lx, y: 4, width: 10, height: 10, fill: color });
    add(legend, "text", { x: lx + 14, y: 13 }, label);
    lx += 24 + 6.2 * label.length;
    if (lx > width - 120) break;
  }

  // axis and lanes
  const step = timelineStep(view.t1 - view.t0, inner);
  const axis = add(svg, "g", { class: "tl-axis" });
  for (let t = Math.ceil(view.t0 / step) * step; t <= view.t1; t += step) {
    add(axis, "line", { x1: x(t), x2: x(t), y1: pad.top - 4, y2: height - pad.bottom, class: "tl-grid" });
    if (x(t) < width - 60) add(axis, "text", { x: x(t) + 2, y: height - 6 }, timelineClock(t, step));
  }
  lanes.forEach((lane, i) => {
    const y = pad.top + i * laneHeight;
    if (i % 2) add(axis, "rect", { x: pad.left, y, width: inner, height: laneHeight, class: "tl-stripe" });
    if (laneHeight >= 10) add(axis, "text", { x: 4, y: y + laneHeight - 5, class: "tl-lane" }, lane);
  });

  // bars, then marks on top
  const clip = `tl-clip-${Math.random().toString(36).slice(2)}`;
  const defs = add(svg, "defs", {});
  const clipPath = add(defs, "clipPath", { id: clip });
  add(clipPath, "rect", { x: pad.left, y: 0, width: inner, height });
  const bars = add(svg, "g", { class: "tl-bars", "clip-path": `url(#${clip})` });
  const marks = add(svg, "g", { class: "tl-marks", "clip-path": `url(#${clip})` });
  for (const span of spans) {
    if (span.end < view.t0 || span.start > view.t1) continue;
    const outcome = TIMELINE_OUTCOMES[span.outcome] || TIMELINE_OUTCOMES.ok;
    const y = laneY(span);
    const color = byJob ? TIMELINE_JOB_COLORS[jobs.indexOf(span.job_id || "") % TIMELINE_JOB_COLORS.length] : outcome.color;
    const when = `${timelineClock(span.start, 0.5)} → ${timelineClock(span.end, 0.5)} (${(span.end - span.start).toFixed(3)} s)`;
    const where = `${span.daemon_id} slot ${span.slot}`;
    let node;
    if (span.outcome === "slot_taken") {
      node = add(marks, "path", {
        d: `M${x(span.start)},${y} v${laneHeight} m-4,-${laneHeight} l4,5 l4,-5`,
        stroke: outcome.color,
        "stroke-width": 2,
        fill: "none",
      });
      add(node, "title", {}, `slot taken from ${span.job_id || "the job"} · ${where} · ${timelineClock(span.start, 0.5)}`);
    } else {
      const x0 = x(span.start);
      node = add(bars, "rect", {
        x: x0,
        y: y + 2,
        width: Math.max(2, x(span.end) - x0),
        height: laneHeight - 4,
        fill: color,
      });
      const job = byJob ? `job ${span.job_id} · ` : "";
      const error = span.error ? ` (${span.error})` : "";
      add(node, "title", {}, `${job}task ${span.task_id} · attempt ${span.attempt} · ${outcome.label}${error}\n${when}\n${where}`);
      if (outcome.mark) {
        // a triangle in the outcome's colour over the attempt's end, outlined to stand out on its bar
        const mark = add(marks, "path", {
          d: `M${x(span.end)},${y + laneHeight / 2} l-4,-${laneHeight / 2} h8 z`,
          fill: outcome.color,
          stroke: "#fff",
          "stroke-width": 0.8,
        });
        mark.setAttribute("class", `tl-mark tl-mark-${span.outcome}`);
      }
    }
    node.setAttribute("class", `tl-span tl-${span.outcome}`);
    node.setAttribute("data-task", span.task_id || "");
    node.setAttribute("data-outcome", span.outcome);
  }

  if (!svg.truba_wired) {
    svg.truba_wired = true;
    timelineWire(svg, pad);
  }
}

// Zoom (wheel) and pan (drag) change the element's view; a double click resets it.
function timelineWire(svg, pad) {
  const toTime = (clientX) => {
    const box = svg.getBoundingClientRect();
    const view = svg.truba_view;
    const scale = (svg.viewBox.baseVal.width || box.width) / box.width;
    const inner = (svg.viewBox.baseVal.width || box.width) - pad.left - pad.right;
    return view.t0 + (((clientX - box.left) * scale - pad.left) / inner) * (view.t1 - view.t0);
  };
  svg.addEventListener(
    "wheel",
    (event) => {
      const view = svg.truba_view;
      if (!view) return;
      event.preventDefault();
      const at = toTime(event.clientX);
      const factor = event.deltaY > 0 ? 1.25 : 0.8;
      view.t0 = at - (at - view.t0) * factor;
      view.t1 = at + (view.t1 - at) * factor;
      view.zoomed = true;
      svg.truba_redraw();
    },
    { passive: false }
  );
  let dragging = null;
  svg.addEventListener("mousedown", (event) => {
    const view = svg.truba_view;
    if (!view) return;
    const box = svg.getBoundingClientRect();
    const inner = box.width * (1 - (pad.left + pad.right) / (svg.viewBox.baseVal.width || box.width));
    dragging = { x: event.clientX, t0: view.t0, t1: view.t1, perPixel: (view.t1 - view.t0) / Math.max(1, inner) };
  });
  window.addEventListener("mouseup", () => (dragging = null));
  svg.addEventListener("mousemove", (event) => {
    if (!dragging) return;
    const shift = (dragging.x - event.clientX) * dragging.perPixel;
    svg.truba_view = { t0: dragging.t0 + shift, t1: dragging.t1 + shift, zoomed: true };
    svg.truba_redraw();
  });
  svg.addEventListener("dblclick", () => {
    svg.truba_view = null;
    svg.truba_redraw();
  });
}
