// One job: its definition (secret headers come masked from the API), next ticks, its
// runs a page at a time, and the actions its token's scopes allow, all through /v1.
"use strict";

(() => {
  const T = window.Tickgate;
  const REFRESH_MS = 5000;
  const RUNS_PER_PAGE = 25;
  const CHART_RUNS = 100;
  const name = document.getElementById("job").dataset.job;
  const path = `/v1/jobs/${encodeURIComponent(name)}`;
  let runCursors = [null];
  let nextRunCursor = null;
  let deleted = false;

  function notice(text) {
    const box = document.getElementById("notice");
    box.textContent = text;
    box.hidden = !text;
  }

  function showDefinition(job) {
    const fields = [
      ["Description", job.description || "—"],
      ["Schedule", `${job.schedule_text} (${JSON.stringify(job.schedule)})`],
      ["Time zone", job.timezone],
      ["State", job.state + (job.pause_note ? ` (note: ${job.pause_note})` : "")],
      ["Task", job.task],
      ["Overlap", job.overlap],
      ["Timeout", `${job.timeout_seconds} s`],
      ["Misfire grace", `${job.misfire_grace_seconds} s`],
      ["Catch-up", job.catchup],
      ["Retry", JSON.stringify(job.retry)],
      ["Jitter", `${job.jitter_seconds} s`],
      ["Window", `${job.start_at || "—"} to ${job.end_at || "—"}`],
      ["Runs", `${job.runs_started}${job.max_runs ? ` of ${job.max_runs}` : ""}`],
      ["Managed by", job.managed_by || "—"],
      ["Version", job.version],
    ];
    const list = document.getElementById("definition");
    list.replaceChildren(...fields.flatMap(([term, value]) => [T.el("dt", term), T.el("dd", value)]));
    list.dataset.state = job.state;
    document.getElementById("args").textContent = JSON.stringify(job.args, null, 2);
    const ticks = job.next_runs.map((tick) => {
      const item = T.el("li");
      item.append(T.when(tick));
      return item;
    });
    if (!ticks.length) ticks.push(T.el("li", "none", "muted"));
    document.getElementById("next-ticks").replaceChildren(...ticks);
    document.getElementById("pause-form").hidden = job.state !== "active";
    document.getElementById("resume").hidden = job.state !== "paused";
  }

  function late(run) {
    const seconds = (Date.parse(run.started_at) - Date.parse(run.scheduled_for)) / 1000;
    return run.trigger === "schedule" ? `${seconds.toFixed(1)} s` : "";
  }

  function runRow(run) {
    const tick = T.el("a", T.absolute(run.scheduled_for));
    tick.href = `${T.root}/ui/runs/${encodeURIComponent(run.id)}`;
    return T.row([
      tick,
      T.badge(run.status),
      run.trigger,
      T.when(run.started_at),
      late(run),
      run.duration_ms === null ? "" : `${run.duration_ms} ms`,
      run.attempts,
      run.runner,
      run.error || run.skip_reason || "",
    ]);
  }

  async function loadRuns() {
    const params = new URLSearchParams({ limit: String(RUNS_PER_PAGE) });
    const cursor = runCursors[runCursors.length - 1];
    if (cursor) params.set("cursor", cursor);
    const page = await T.api(`${path}/runs?${params}`);
    document.querySelector("#runs tbody").replaceChildren(...page.items.map(runRow));
    document.getElementById("no-runs").hidden = page.items.length > 0;
    nextRunCursor = page.next_cursor;
    document.getElementById("runs-next").disabled = !nextRunCursor;
    document.getElementById("runs-first").disabled = runCursors.length < 2;
  }

  async function loadChart() {
    const page = await T.api(`${path}/runs?limit=${CHART_RUNS}`);
    const chart = document.getElementById("chart");
    T.chart.draw(chart, page.items);
    const none = chart.dataset.runs === "0";
    chart.toggleAttribute("hidden", none);
    document.getElementById("no-chart").hidden = !none;
  }

  async function load() {
    if (deleted) return;
    try {
      showDefinition(await T.api(path));
      await Promise.all([loadRuns(), loadChart()]);
      T.showError(null);
    } catch (error) {
      T.showError(error);
    }
  }

  // Each action goes through the API; a refusal shows the API's own error text.
  async function act(what, request) {
    notice("");
    try {
      await request();
      notice(what);
      T.showError(null);
      await load();
    } catch (error) {
      T.showError(error);
    }
  }

  document.getElementById("pause-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const note = document.getElementById("pause-note").value.trim();
    act("Paused.", () => T.api(`${path}/pause`, { method: "POST", body: note ? { note } : {} }));
  });
  document.getElementById("resume").addEventListener("click", () => {
    act("Resumed.", () => T.api(`${path}/resume`, { method: "POST" }));
  });
  document.getElementById("trigger").addEventListener("click", () => {
    act("Triggered: the run shows below when it starts.", () =>
      T.api(`${path}/trigger`, { method: "POST" }));
  });
  document.getElementById("delete").addEventListener("click", async () => {
    if (!window.confirm(`Delete job ${name} and its run history?`)) return;
    try {
      await T.api(path, { method: "DELETE" });
      deleted = true;
      window.location.assign(`${T.root}/ui/`);
    } catch (error) {
      T.showError(error);
    }
  });
  document.getElementById("runs-next").addEventListener("click", () => {
    if (!nextRunCursor) return;
    runCursors.push(nextRunCursor);
    loadRuns().catch(T.showError);
  });
  document.getElementById("runs-first").addEventListener("click", () => {
    runCursors = [null];
    loadRuns().catch(T.showError);
  });

  T.scopes()
    .then((scopes) => {
      const actions = document.getElementById("actions");
      actions.hidden = !scopes.has("write");
      // Says the scopes are known (hidden then means "not allowed", not "not yet").
      actions.dataset.scopes = [...scopes].sort().join(" ");
    })
    .catch(T.showError);
  load();
  setInterval(load, REFRESH_MS);
})();
