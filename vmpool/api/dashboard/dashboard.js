// vmpool's live dashboard: polls the API's feed and redraws the page, no reload.
// Data only ever goes into the page as text (textContent, attributes), never as HTML.
"use strict";
(function () {
  const FEED = "/dashboard/stats/vmpool/live";
  const REFRESH_MS = 2000;
  const SVG = "http://www.w3.org/2000/svg";
  let serverNow = 0; // the feed's time (Redis server time, seconds)

  function $(selector) { return document.querySelector(selector); }

  function el(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
    return node;
  }

  function age(seconds) {
    const s = Math.max(0, Math.round(seconds));
    if (s < 120) return s + " s";
    if (s < 7200) return Math.round(s / 60) + " min";
    return Math.round(s / 3600) + " h";
  }

  function utc(seconds) {
    return new Date(seconds * 1000).toISOString().replace("T", " ").replace("Z", "");
  }

  // A line (or bars) of the values in an inline SVG, with its range in a tooltip.
  function chart(values, kind) {
    const w = 160, h = 28;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.setAttribute("class", "chart " + kind);
    svg.setAttribute("data-points", String(values.length));
    const max = Math.max(1, ...values);
    const step = values.length > 1 ? w / (values.length - 1) : w;
    const y = (v) => (h - 2 - (v / max) * (h - 4)).toFixed(1);
    if (kind === "bars") {
      const bw = Math.max(1, w / Math.max(1, values.length) - 1);
      values.forEach((v, i) => {
        const bar = document.createElementNS(SVG, "rect");
        bar.setAttribute("x", (i * (w / values.length)).toFixed(1));
        bar.setAttribute("y", y(v));
        bar.setAttribute("width", bw.toFixed(1));
        bar.setAttribute("height", (h - 2 - y(v)).toFixed(1));
        svg.appendChild(bar);
      });
    } else if (values.length) {
      const line = document.createElementNS(SVG, "polyline");
      const pts = values.map((v, i) => (i * step).toFixed(1) + "," + y(v));
      if (values.length === 1) pts.push(w + "," + y(values[0]));
      line.setAttribute("points", pts.join(" "));
      svg.appendChild(line);
    }
    const title = document.createElementNS(SVG, "title");
    title.textContent = values.length
      ? values.length + " minutes, " + Math.min(...values) + " to " + Math.max(...values)
      : "no history yet";
    svg.appendChild(title);
    return svg;
  }

  function timelineLink(kind, subject) {
    const path = kind === "request"
      ? "/api/v3/ondemandvm/" + encodeURIComponent(subject) + "/timeline"
      : "/api/v3/vm/" + encodeURIComponent(subject) + "/timeline";
    const link = el("a", subject, { href: path, "data-timeline": subject });
    link.addEventListener("click", (event) => { event.preventDefault(); showTimeline(subject, path); });
    return link;
  }

  function poolRow(body, pool) {
    let row = body.querySelector('tr[data-pool="' + CSS.escape(pool.name) + '"]');
    if (!row) {
      row = el("tr", null, { "data-pool": pool.name });
      row.appendChild(el("th", pool.name, { scope: "row" }));
      for (const stat of ["ready", "size", "pending", "running"]) {
        row.appendChild(el("td", "", { "data-stat": stat, class: "num" }));
      }
      row.appendChild(el("td", "", { "data-stat": "history" }));
      row.appendChild(el("td", "", { "data-stat": "error" }));
    }
    body.appendChild(row); // keeps the feed's order; a row moved, not redrawn
    return row;
  }

  function drawPools(pools) {
    const body = $("#pools tbody");
    const seen = new Set();
    for (const pool of pools) {
      seen.add(pool.name);
      const row = poolRow(body, pool);
      for (const stat of ["ready", "size", "pending", "running"]) {
        row.querySelector('[data-stat="' + stat + '"]').textContent = String(pool[stat]);
      }
      row.querySelector('[data-stat="history"]').replaceChildren(chart(pool.history, "line"));
      const f = pool.failures;
      const cell = row.querySelector('[data-stat="error"]');
      row.classList.toggle("failing", f.failing);
      cell.textContent = f.failing
        ? f.consecutive_failures + " failed in a row: " + f.last_error +
          (f.retry_at ? " (next try in " + age(f.retry_at - serverNow) + ")" : "")
        : "ok";
    }
    for (const row of [...body.rows]) if (!seen.has(row.dataset.pool)) row.remove();
  }

  function drawRequests(requests) {
    $("#requests-open").textContent = String(requests.open);
    const rows = requests.shown.map((r) => {
      const row = el("tr", null, { "data-request": r.request_id });
      row.appendChild(el("td")).appendChild(timelineLink("request", r.request_id));
      const asked = Object.entries(r.pools).map(([a, c]) => a + " " + c.ready + "/" + c.want);
      row.appendChild(el("td", asked.join(", ")));
      row.appendChild(el("td", age(r.age_s), { class: "num", "data-stat": "age" }));
      return row;
    });
    $("#requests tbody").replaceChildren(...(rows.length ? rows : [emptyRow(3, "none")]));
  }

  function emptyRow(span, text) {
    const row = el("tr");
    row.appendChild(el("td", text, { colspan: String(span), class: "empty" }));
    return row;
  }

  function drawFailures(failures) {
    const rows = failures.map((f) => {
      const row = el("tr", null, { "data-failure": f.kind });
      row.appendChild(el("td", age(f.age_s) + " ago", { class: "num" }));
      row.appendChild(el("td", f.kind));
      row.appendChild(el("td", f.pool));
      const of = row.appendChild(el("td"));
      if (f.request_id) of.appendChild(timelineLink("request", f.request_id));
      else if (f.vm) of.appendChild(timelineLink("vm", f.vm));
      row.appendChild(el("td", f.reason, { class: "reason", "data-stat": "reason" }));
      return row;
    });
    $("#failures tbody").replaceChildren(...(rows.length ? rows : [emptyRow(5, "none")]));
  }

  function drawRates(rates) {
    for (const what of ["created", "destroyed"]) {
      const values = rates[what];
      document.querySelector('[data-stat="' + what + '-last"]').textContent =
        String(values.length ? values[values.length - 1] : 0);
      $("#" + what + "-chart").replaceChildren(chart(values, "bars"));
    }
  }

  async function showTimeline(subject, path) {
    $("#timeline-panel").hidden = false;
    $("#timeline-subject").textContent = subject;
    $("#timeline-json").setAttribute("href", path);
    const body = $("#timeline tbody");
    try {
      const answer = await (await fetch(path, { cache: "no-store" })).json();
      const rows = (answer.timeline || []).map((e) => {
        const row = el("tr", null, e.error ? { class: "failing" } : {});
        for (const text of [utc(e.time), e.entity, e.from + " \u2192 " + e.to,
          e.provider_call || "", e.actor, e.reason]) row.appendChild(el("td", text));
        return row;
      });
      body.replaceChildren(...(rows.length ? rows : [emptyRow(6, answer.message || "nothing")]));
    } catch (err) {
      body.replaceChildren(emptyRow(6, "could not read the timeline: " + err));
    }
  }

  async function refresh() {
    try {
      const response = await fetch(FEED, { cache: "no-store" });
      if (!response.ok) throw new Error("HTTP " + response.status);
      const feed = await response.json();
      serverNow = feed.time;
      drawPools(feed.pools);
      drawRequests(feed.requests);
      drawFailures(feed.failures);
      drawRates(feed.rates);
      document.body.dataset.state = "ok";
      document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes) + 1);
      $("#updated").textContent = "updated " + utc(feed.time) + " UTC";
    } catch (err) {
      document.body.dataset.state = "error";
      $("#updated").textContent = "cannot reach the API (" + err.message + "); retrying";
    } finally {
      setTimeout(refresh, REFRESH_MS);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("#timeline-close").addEventListener("click", () => { $("#timeline-panel").hidden = true; });
    refresh();
  });
})();
