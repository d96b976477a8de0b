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

  // "up to 3 attempts, waiting 5 s at first, doubling 5 times, at most 1 h"
  function retryText(retry) {
    if (retry.max_attempts === 1) return "no retries (1 attempt)";
    const parts = [
      `up to ${retry.max_attempts} attempts`,
      `waiting ${T.duration(retry.min_backoff_seconds)} at first`,
      `doubling ${retry.max_doublings} times`,
      `at most ${T.duration(retry.max_backoff_seconds)}`,
    ];
    if (retry.max_retry_seconds) parts.push(`all within ${T.duration(retry.max_retry_seconds)}`);
    return parts.join(", ");
  }

  function windowText(job) {
    if (!job.start_at && !job.end_at) return "always";
    const from = job.start_at ? `from ${T.absolute(job.start_at)}` : "";
    const to = job.end_at ? `until ${T.absolute(job.end_at)}` : "";
    return [from, to].filter(Boolean).join(" ");
  }

  // "on failure, recovery: POST https://..." / "on success: run report"
  function hookText(hook) {
    const action = hook.action.kind === "http"
      ? `${hook.action.args.method || "POST"} ${hook.action.args.url}`
      : `run ${hook.action.job}${hook.action.args ? " with other arguments" : ""}`;
    return `on ${hook.on.join(", ")}: ${action}`;
  }

  function showHooks(job) {
    const items = job.hooks.map((hook) => T.el("li", hookText(hook)));
    if (!job.default_hooks) items.push(T.el("li", "the cluster's default hooks: off", "muted"));
    if (!items.length) items.push(T.el("li", "none", "muted"));
    document.getElementById("hooks").replaceChildren(...items);
  }

  function showDefinition(job) {
    const fields = [
      ["Description", job.description || "—"],
      ["Schedule", job.schedule_text],
      ["Time zone", job.timezone],
      ["State", job.state + (job.pause_note ? ` (note: ${job.pause_note})` : "")],
      ["Task", job.task],
      ["Overlap", job.overlap],
      ["Timeout", `${job.timeout_seconds} s`],
      ["Misfire grace", `${job.misfire_grace_seconds} s`],
      ["Catch-up", job.catchup],
      ["Retry", retryText(job.retry)],
      ["Jitter", `${job.jitter_seconds} s`],
      ["Window", windowText(job)],
      // runs_started is counted only for a capped job (it costs a row update per tick).
      ["Max runs", job.max_runs ? `${job.runs_started} used of ${job.max_runs}` : "no limit"],
      ["Managed by", job.managed_by || "—"],
      ["Version", job.version],
    ];
    const list = document.getElementById("definition");
    list.replaceChildren(...fields.flatMap(([term, value]) => [T.el("dt", term), T.el("dd", value)]));
    list.dataset.state = job.state;
    document.getElementById("args").textContent = JSON.stringify(job.args, null, 2);
    const policies = { schedule: job.schedule, retry: job.retry, start_at: job.start_at, end_at: job.end_at };
    document.getElementById("policies-json").textContent = JSON.stringify(policies, null, 2);
    showHooks(job);
    const ticks = job.next_runs.map((tick) => {
      const item = T.el("li");
      item.append(T.when(tick));
      return item;
    });
    if (!ticks.length) ticks.push(T.el("li", "none", "muted"));
    document.getElementById("next-ticks").replaceChildren(...ticks);
    document.getElementById("pause-form").hidden = job.state !== "active";
    document.getElementById("resume").hidden = job.state !== "paused";
    // An app's job (the APScheduler gate) is defined and run in the app: here it can
    // only be paused, resumed or deleted.
    const byApp = job.schedule.kind === "app";
    for (const id of ["trigger", "run-with-args", "edit", "clone"]) {
      document.getElementById(id).hidden = byApp;
    }
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

  function runLink(runId, text) {
    const link = T.el("a", text);
    link.href = `${T.root}/ui/runs/${encodeURIComponent(runId)}`;
    return link;
  }

  // The newest failure, at the top of the page: when, its error, and its run.
  async function loadLastFailure() {
    const params = new URLSearchParams({ job: name, status: "failed,timed_out,abandoned", limit: "1" });
    const [failure] = (await T.api(`/v1/runs?${params}`)).items;
    const box = document.getElementById("last-failure");
    box.hidden = !failure;
    if (!failure) return;
    box.replaceChildren(
      `Last failure ${T.relative(failure.finished_at || failure.started_at)} (${failure.status}): `,
      T.el("strong", failure.error || "no error recorded"),
      " ",
      runLink(failure.id, "see the run"),
    );
  }

  async function loadDeliveries() {
    const page = await T.api(`${path}/hooks?limit=10`);
    const rows = page.items.map((one) => T.row([
      T.when(one.created_at),
      one.event,
      `${one.is_default ? "default " : ""}${one.hook}`,
      T.badge(one.status),
      one.attempts,
      runLink(one.run_id, "run"),
      one.last_error || "",
    ]));
    document.querySelector("#deliveries tbody").replaceChildren(...rows);
    document.getElementById("no-deliveries").hidden = rows.length > 0;
  }

  async function load() {
    if (deleted) return;
    try {
      showDefinition(await T.api(path));
      await Promise.all([loadRuns(), loadChart(), loadLastFailure(), loadDeliveries()]);
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
  // Run with arguments: the task's fields, filled with the job's own args.
  const argsRun = document.getElementById("args-run");
  const runArgs = document.getElementById("run-args");
  document.getElementById("run-with-args").addEventListener("click", async () => {
    try {
      const [tasks, job] = await Promise.all([T.api("/v1/tasks"), T.api(path)]);
      const task = tasks.items.find((one) => one.name === job.task);
      T.argsForm.render(runArgs, task && task.args_schema, job.args);
      argsRun.hidden = false;
      (runArgs.querySelector("input, select, textarea") || document.getElementById("run-note")).focus();
    } catch (error) {
      T.showError(error);
    }
  });
  document.getElementById("run-args-close").addEventListener("click", () => {
    argsRun.hidden = true;
    document.getElementById("run-with-args").focus(); // back where the keyboard was
  });
  argsRun.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { args: T.argsForm.read(runArgs) };
    const note = document.getElementById("run-note").value.trim();
    if (note) body.note = note;
    try {
      const run = await T.api(`${path}/trigger`, { method: "POST", body });
      argsRun.hidden = true;
      const box = document.getElementById("notice");
      box.replaceChildren("Started ", runLink(run.id, "a run with these arguments"), ".");
      box.hidden = false;
      box.querySelector("a").focus(); // the form it was in is gone
      T.showError(null);
      await load();
    } catch (error) {
      T.showError(error);
    }
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

  T.offerActions();
  load();
  setInterval(load, REFRESH_MS);
})();
