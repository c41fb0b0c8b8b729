// The dashboard's behaviour, in plain JavaScript (no framework, no build step, no request to
// any other host): sign in and out, submit a job, follow a job's state, log and metrics live,
// cancel or rerun it. Pages are rendered by the server; this only adds what must be live.
// Every text from the server goes in with textContent, never as markup.
"use strict";

const ENDED = ["succeeded", "failed", "cancelled"];
const POLL_MS = 2000;
const LOG_LINES_KEPT = 5000; // a long log keeps its tail in the page

function cookie(name) {
  for (const part of document.cookie.split(";")) {
    const [key, ...rest] = part.trim().split("=");
    if (key === name) return decodeURIComponent(rest.join("="));
  }
  return "";
}

// A change (POST, PATCH, DELETE) carries the session's CSRF value from its cookie: another site
// cannot read the cookie, so it cannot forge the header.
function send(method, url, body, json = true) {
  const headers = { "X-CSRF-Token": cookie("dlscale_csrf") };
  if (json) headers["Content-Type"] = "application/json";
  return fetch(url, {
    method,
    headers,
    body: json ? JSON.stringify(body || {}) : body,
    credentials: "same-origin",
  });
}

function post(url, body, json = true) {
  return send("POST", url, body, json);
}

async function detailOf(response) {
  try {
    const answer = await response.json();
    if (typeof answer.detail === "string") return answer.detail;
    return JSON.stringify(answer.detail);
  } catch (_) {
    return `the server answered ${response.status}`;
  }
}

function localTimes(root) {
  for (const node of root.querySelectorAll("time[data-unix]")) {
    const unix = Number(node.dataset.unix);
    if (Number.isFinite(unix) && unix > 0) {
      node.dateTime = new Date(unix * 1000).toISOString();
      node.textContent = new Date(unix * 1000).toLocaleString();
    }
  }
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function timeCell(unix) {
  const cell = el("td");
  if (unix) {
    const node = el("time", unix);
    node.dataset.unix = unix;
    cell.append(node);
  } else {
    cell.textContent = "-";
  }
  return cell;
}

function stateBadge(node, state) {
  node.textContent = state;
  node.className = `state state-${state}`;
}

// ------------------------------------------------------------------------- sign in and out

function setupLogout() {
  const button = document.getElementById("logout");
  if (!button) return;
  button.addEventListener("click", async () => {
    await post("/api/logout");
    location.assign("/login");
  });
}

function setupLogin() {
  const form = document.getElementById("login-form");
  if (!form) return;
  const error = document.getElementById("login-error");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    const body = {
      name: document.getElementById("login-name").value,
      password: document.getElementById("login-password").value,
    };
    const response = await fetch("/api/login", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      credentials: "same-origin",
    });
    if (!response.ok) {
      error.textContent = await detailOf(response);
      return;
    }
    // Signed in on a page that asked for it (its address kept): show that page now.
    if (location.pathname === "/login") location.assign("/");
    else location.reload();
  });
}

// ------------------------------------------------------------------------------ jobs list

function setupSubmit() {
  const form = document.getElementById("submit-form");
  if (!form) return;
  const error = document.getElementById("submit-error");
  const button = document.getElementById("submit-button");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    button.disabled = true;
    const data = new FormData();
    const spec = document.getElementById("submit-spec").value;
    data.append("spec", new Blob([spec], { type: "application/x-yaml" }), "spec.yaml");
    data.append("kind", document.getElementById("submit-kind").value);
    data.append("tenant", document.getElementById("submit-tenant").value);
    for (const file of document.getElementById("submit-files").files) {
      data.append("files", file, file.name);
    }
    try {
      const response = await post("/api/jobs", data, false);
      if (response.status === 201) {
        const job = await response.json();
        location.assign(`/jobs/${encodeURIComponent(job.id)}`);
        return;
      }
      error.textContent = await detailOf(response);
    } catch (failure) {
      error.textContent = `could not reach the server: ${failure.message}`;
    }
    button.disabled = false;
  });
}

function jobRow(job) {
  const row = el("tr");
  const link = el("a");
  link.href = `/jobs/${encodeURIComponent(job.id)}`;
  link.append(el("code", job.id));
  const first = el("td");
  first.append(link);
  const state = el("td");
  const badge = el("span");
  stateBadge(badge, job.state);
  state.append(badge);
  row.append(first, state, el("td", job.tenant), el("td", job.kind));
  row.append(el("td", job.reason || job.message, "message"));
  row.append(timeCell(job.submitted_at), timeCell(job.ended_at));
  return row;
}

function setupJobList() {
  const table = document.getElementById("jobs-table");
  if (!table) return;
  const body = table.querySelector("tbody");
  const live = () =>
    [...body.querySelectorAll(".state")].some((n) => !ENDED.includes(n.textContent));
  const refresh = async () => {
    if (!live()) return; // nothing will change until a new job comes
    const response = await fetch("/api/jobs", { credentials: "same-origin" });
    if (response.ok) {
      body.replaceChildren(...(await response.json()).map(jobRow));
      localTimes(body);
    }
  };
  setInterval(refresh, POLL_MS);
}

// ------------------------------------------------------------------------------- one job

function follow(url, kind, onData, onEnd) {
  // EventSource resends the last event id itself when it reconnects: no line lost or repeated.
  const source = new EventSource(url);
  source.addEventListener(kind, (event) => onData(event.data));
  source.addEventListener("end", (event) => {
    source.close(); // the job ended: do not reconnect
    onEnd(event.data);
  });
  return source;
}

function setupLog(jobId) {
  const log = document.getElementById("log");
  const status = document.getElementById("log-status");
  const source = follow(
    `/api/jobs/${jobId}/logs`,
    "log",
    (line) => {
      const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      log.append(`${line}\n`);
      while (log.childNodes.length > LOG_LINES_KEPT) log.firstChild.remove();
      if (atBottom) log.scrollTop = log.scrollHeight;
      status.textContent = "live";
    },
    (state) => {
      status.textContent = `the job ended: ${state}`;
    },
  );
  source.addEventListener("open", () => {
    status.textContent = "live";
  });
  source.addEventListener("error", () => {
    if (source.readyState !== EventSource.CLOSED) status.textContent = "reconnecting…";
  });
}

function timeNode(unix) {
  const node = el("time", unix);
  node.dataset.unix = unix;
  return node;
}

// The step-time card from the job's run record, written at every epoch while it runs.
function showSplit(split) {
  const table = document.getElementById("time-split");
  const note = document.getElementById("time-split-note");
  if (!split || !table) return;
  table.hidden = false;
  table.querySelector("tbody").replaceChildren(
    ...split.parts.map((part) => {
      const row = el("tr");
      const share = `${(100 * part.share).toFixed(1)}%`;
      const meter = el("meter", share);
      meter.min = 0;
      meter.max = 1;
      meter.value = part.share;
      const bar = el("td");
      bar.append(meter);
      row.append(el("td", part.name), el("td", part.seconds.toFixed(3)), el("td", share), bar);
      return row;
    }),
  );
  note.textContent =
    `The main trainer's ${split.steps} steps so far, ${split.step_s.toFixed(2)} s in all ` +
    "(from run/run.json, written at every epoch).";
}

function setupJobState(jobId, root) {
  const badge = document.getElementById("job-state");
  const message = document.getElementById("job-message");
  const events = document.getElementById("events");
  const cancel = document.getElementById("cancel-button");
  const started = document.getElementById("job-started");
  const endedAtLoad = root.dataset.ended === "true";
  if (endedAtLoad) return;
  const timer = setInterval(async () => {
    const response = await fetch(`/api/jobs/${jobId}`, { credentials: "same-origin" });
    if (!response.ok) return;
    const job = await response.json();
    stateBadge(badge, job.state);
    message.textContent = job.reason || job.message;
    if (job.started_at && !started.querySelector("time")) {
      started.replaceChildren(timeNode(job.started_at));
      localTimes(started);
    }
    showSplit(job.time_split);
    events.replaceChildren(
      ...job.events.map((e) => {
        const row = el("tr");
        row.append(timeCell(e.at), el("td", e.state), el("td", e.message));
        return row;
      }),
    );
    localTimes(events);
    if (ENDED.includes(job.state)) {
      clearInterval(timer);
      if (cancel) cancel.hidden = true;
      // The result, reproduction record, time split and artifacts are rendered by the server.
      location.reload();
    }
  }, POLL_MS);
}

function setupActions(jobId) {
  const error = document.getElementById("action-error");
  const cancel = document.getElementById("cancel-button");
  const rerun = document.getElementById("rerun-button");
  const remove = document.getElementById("delete-button");
  if (remove) {
    remove.addEventListener("click", async () => {
      if (!window.confirm("Delete this job and all its files? This cannot be undone.")) return;
      error.textContent = "";
      remove.disabled = true;
      const response = await send("DELETE", `/api/jobs/${jobId}`);
      if (!response.ok) {
        error.textContent = await detailOf(response);
        remove.disabled = false;
        return;
      }
      const answer = await response.json();
      if (answer.deleted) {
        location.assign("/");
        return;
      }
      document.getElementById("job-message").textContent =
        "deletion requested: the job stops, then it and its files are deleted";
    });
  }
  if (cancel) {
    cancel.addEventListener("click", async () => {
      error.textContent = "";
      cancel.disabled = true;
      const response = await post(`/api/jobs/${jobId}/cancel`);
      if (!response.ok) {
        error.textContent = await detailOf(response);
        cancel.disabled = false;
        return;
      }
      const answer = await response.json();
      stateBadge(document.getElementById("job-state"), answer.state);
      document.getElementById("job-message").textContent = ENDED.includes(answer.state)
        ? "cancelled"
        : "cancel requested: the job stops at its next step";
    });
  }
  if (rerun) {
    rerun.addEventListener("click", async () => {
      error.textContent = "";
      rerun.disabled = true;
      const response = await post(`/api/jobs/${jobId}/rerun`);
      if (response.status === 201) {
        location.assign(`/jobs/${encodeURIComponent((await response.json()).id)}`);
        return;
      }
      error.textContent = await detailOf(response);
      rerun.disabled = false;
    });
  }
}

// -------------------------------------------------------------------------------- chart

const SERIES = {
  train: [
    { key: "train_loss", label: "train loss", color: "#2563eb", axis: "left" },
    { key: "val_loss", label: "val loss", color: "#ea580c", axis: "left" },
    { key: "val_accuracy", label: "val accuracy", color: "#16a34a", axis: "right" },
  ],
  sweep: [{ key: "metric", label: "trial metric", color: "#7c3aed", axis: "left" }],
};
const AXES = {
  train: { x: "epoch", left: "loss", right: "accuracy" },
  sweep: { x: "trial", left: "metric", right: null },
};

function niceMax(value) {
  if (!(value > 0)) return 1;
  const step = 10 ** Math.floor(Math.log10(value));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= value) return m * step;
  return 10 * step;
}

function drawChart(canvas, kind, rows) {
  const series = SERIES[kind];
  const axes = AXES[kind];
  const ratio = window.devicePixelRatio || 1;
  const box = canvas.getBoundingClientRect();
  canvas.width = Math.round(box.width * ratio);
  canvas.height = Math.round(box.height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  const w = box.width;
  const h = box.height;
  const pad = { left: 56, right: axes.right ? 56 : 16, top: 34, bottom: 42 };
  const plotW = w - pad.left - pad.right;
  const plotH = h - pad.top - pad.bottom;
  ctx.clearRect(0, 0, w, h);
  ctx.font = "12px system-ui, sans-serif";

  const xs = rows.map((row, i) => (kind === "train" ? row.epoch : i + 1));
  const xMax = Math.max(1, ...xs);
  const leftValues = [];
  for (const s of series.filter((s) => s.axis === "left")) {
    for (const row of rows) if (Number.isFinite(row[s.key])) leftValues.push(row[s.key]);
  }
  const leftMax = niceMax(Math.max(0, ...leftValues));
  const X = (x) => pad.left + (xMax <= 1 ? plotW / 2 : ((x - 1) / (xMax - 1)) * plotW);
  const Y = (v, axis) => pad.top + plotH - (v / (axis === "right" ? 1 : leftMax)) * plotH;

  // Grid and tick labels: five steps on each y axis, whole numbers on x.
  ctx.strokeStyle = "#e5e7eb";
  ctx.fillStyle = "#4b5563";
  ctx.lineWidth = 1;
  for (let i = 0; i <= 5; i++) {
    const y = pad.top + plotH - (i / 5) * plotH;
    ctx.beginPath();
    ctx.moveTo(pad.left, y);
    ctx.lineTo(pad.left + plotW, y);
    ctx.stroke();
    ctx.textAlign = "right";
    ctx.fillText(((leftMax * i) / 5).toPrecision(2), pad.left - 6, y + 4);
    if (axes.right) {
      ctx.textAlign = "left";
      ctx.fillText((i / 5).toFixed(1), pad.left + plotW + 6, y + 4);
    }
  }
  const xStep = Math.max(1, Math.ceil(xMax / 10));
  ctx.textAlign = "center";
  for (let x = 1; x <= xMax; x += xStep) ctx.fillText(String(x), X(x), pad.top + plotH + 16);
  ctx.strokeStyle = "#6b7280";
  ctx.strokeRect(pad.left, pad.top, plotW, plotH);

  // Axis titles.
  ctx.fillStyle = "#111827";
  ctx.fillText(axes.x, pad.left + plotW / 2, h - 8);
  ctx.save();
  ctx.translate(14, pad.top + plotH / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.fillText(axes.left, 0, 0);
  ctx.restore();
  if (axes.right) {
    ctx.save();
    ctx.translate(w - 10, pad.top + plotH / 2);
    ctx.rotate(Math.PI / 2);
    ctx.fillText(axes.right, 0, 0);
    ctx.restore();
  }

  // The series, each with its legend entry along the top.
  let legendX = pad.left;
  for (const s of series) {
    ctx.strokeStyle = s.color;
    ctx.fillStyle = s.color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    let drawing = false;
    rows.forEach((row, i) => {
      const v = row[s.key];
      if (!Number.isFinite(v)) return;
      const px = X(xs[i]);
      const py = Y(v, s.axis);
      if (drawing) ctx.lineTo(px, py);
      else ctx.moveTo(px, py);
      drawing = true;
    });
    ctx.stroke();
    rows.forEach((row, i) => {
      if (!Number.isFinite(row[s.key])) return;
      ctx.beginPath();
      ctx.arc(X(xs[i]), Y(row[s.key], s.axis), 2.5, 0, 2 * Math.PI);
      ctx.fill();
    });
    ctx.fillRect(legendX, 12, 14, 3);
    ctx.fillStyle = "#111827";
    ctx.textAlign = "left";
    ctx.fillText(s.label, legendX + 18, 17);
    legendX += ctx.measureText(s.label).width + 40;
  }
}

function setupChart(jobId, kind) {
  const canvas = document.getElementById("chart");
  const status = document.getElementById("chart-status");
  if (!SERIES[kind]) {
    canvas.hidden = true;
    status.textContent = `a ${kind} job has no per-epoch figures`;
    return;
  }
  const rows = [];
  const redraw = () => drawChart(canvas, kind, rows);
  redraw();
  window.addEventListener("resize", redraw);
  follow(
    `/api/jobs/${jobId}/metrics/stream`,
    "metrics",
    (data) => {
      try {
        rows.push(JSON.parse(data));
      } catch (_) {
        return; // not a metrics line
      }
      canvas.dataset.points = String(rows.length);
      const unit = kind === "train" ? "epoch" : "trial";
      status.textContent = `${rows.length} ${unit}${rows.length === 1 ? "" : "s"}`;
      redraw();
    },
    () => {
      if (!rows.length) status.textContent = "no figures were recorded";
    },
  );
}

function setupJob() {
  const root = document.getElementById("job");
  const jobId = encodeURIComponent(root.dataset.jobId);
  setupLog(jobId);
  setupChart(jobId, root.dataset.kind);
  setupJobState(jobId, root);
  setupActions(jobId);
}

// -------------------------------------------------------------------------------- pages

// ------------------------------------------------------------------------------ admin page

// Each action button carries what it acts on in data attributes; the page reloads to show the
// server's view afterwards (a reset password is shown once, before that).
function setupAdmin() {
  const error = document.getElementById("admin-error");
  const notice = document.getElementById("admin-notice");
  const act = async (method, url, body) => {
    error.textContent = "";
    const response = await send(method, url, body);
    if (!response.ok) {
      error.textContent = await detailOf(response);
      return null;
    }
    return response.json();
  };
  const user = (button) => encodeURIComponent(button.dataset.user);
  for (const button of document.querySelectorAll("[data-action]")) {
    button.addEventListener("click", async () => {
      const action = button.dataset.action;
      if (action === "disable" || action === "enable") {
        const body = { disabled: action === "disable" };
        if (await act("POST", `/api/admin/users/${user(button)}/disable`, body)) location.reload();
      } else if (action === "password") {
        const answer = await act("POST", `/api/admin/users/${user(button)}/password`);
        if (answer) {
          notice.hidden = false;
          notice.replaceChildren(
            `New password for ${answer.name} (shown once): `,
            el("span", answer.password, "password"),
          );
        }
      } else if (action === "remove") {
        const tenant = encodeURIComponent(button.dataset.tenant);
        const url = `/api/admin/tenants/${tenant}/members/${user(button)}`;
        if (await act("DELETE", url)) location.reload();
      }
    });
  }
  for (const form of document.querySelectorAll("form.admin-form")) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = {};
      for (const input of form.querySelectorAll("input[name]")) {
        const text = input.value.trim();
        if (text === input.defaultValue.trim()) continue; // unchanged
        body[input.name] = text === "" ? null : Number(text);
      }
      const tenant = encodeURIComponent(form.dataset.tenant);
      if (await act("PATCH", `/api/admin/tenants/${tenant}`, body)) location.reload();
    });
  }
}

const PAGES = {
  jobs: () => {
    setupSubmit();
    setupJobList();
  },
  job: setupJob,
  admin: setupAdmin,
  queue: () => setInterval(() => location.reload(), 5 * POLL_MS),
};

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  setupLogout();
  setupLogin(); // also on a page answered 401, which shows the form in place
  const page = PAGES[document.body.dataset.page];
  if (page) page();
});
