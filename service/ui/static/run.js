// One run: what it was, what its target answered (JSON pretty-printed), what it logged,
// its hook deliveries, and Cancel while it runs (write scope), all through /v1.
"use strict";

(() => {
  const T = window.Tickgate;
  const REFRESH_MS = 2000;
  const id = document.getElementById("run").dataset.run;
  const path = `/v1/runs/${encodeURIComponent(id)}`;
  let ended = false;

  function notice(text) {
    const box = document.getElementById("notice");
    box.textContent = text;
    box.hidden = !text;
  }

  // From one instant to another: milliseconds below a second, where most runs end.
  function seconds(from, to) {
    if (!from || !to) return "—";
    const ms = Date.parse(to) - Date.parse(from);
    return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
  }

  function showFacts(run) {
    const job = T.el("a", run.job);
    job.href = `${T.root}/ui/jobs/${encodeURIComponent(run.job)}`;
    const link = document.getElementById("job-link");
    link.href = job.href;
    link.textContent = `← ${run.job}`;
    document.getElementById("run-status").replaceChildren(T.badge(run.status));
    const fields = [
      ["Job", job],
      ["Id", run.id],
      ["Tick", T.absolute(run.scheduled_for)],
      ["Trigger", run.trigger + (run.note ? ` (${run.note})` : "")],
      ["Status", run.status + (run.skip_reason ? `: ${run.skip_reason}` : "")],
      ["Started", T.when(run.started_at)],
      ["Finished", T.when(run.finished_at)],
      ["Late", run.trigger === "schedule" ? seconds(run.scheduled_for, run.started_at) : "—"],
      ["Duration", run.duration_ms === null ? "—" : `${run.duration_ms} ms`],
      ["Attempts", run.attempts],
      ["Runner", run.runner],
      ["Error", run.error || "—"],
    ];
    const list = document.getElementById("facts");
    list.replaceChildren(...fields.flatMap(([term, value]) => {
      const dd = T.el("dd");
      dd.append(value instanceof Node ? value : String(value));
      return [T.el("dt", term), dd];
    }));
    document.getElementById("args").textContent = run.args
      ? JSON.stringify(run.args, null, 2) : "The job's own.";
  }

  // Each attempt with its times (an attempt its replica was lost in has no end).
  function showAttempts(attempts) {
    document.querySelector("#attempts tbody").replaceChildren(...attempts.map((one) => T.row([
      String(one.attempt),
      T.absolute(one.started_at),
      one.ended_at ? T.absolute(one.ended_at) : "—",
      seconds(one.started_at, one.ended_at),
      T.badge(one.status),
      one.error || "",
    ])));
    document.getElementById("no-attempts").hidden = attempts.length > 0;
  }

  // JSON shown indented; anything else as it came.
  function pretty(text, contentType) {
    if (!/json/.test(contentType || "")) return text;
    try {
      return JSON.stringify(JSON.parse(text), null, 2);
    } catch (_notWhole) {
      return text; // cut at the cap, or not JSON after all
    }
  }

  function showOutput(output) {
    document.getElementById("no-output").hidden = output !== null;
    const answer = document.getElementById("answer");
    const body = document.getElementById("body");
    const rows = document.getElementById("rows");
    answer.replaceChildren();
    body.hidden = true;
    rows.hidden = true;
    if (output === null) return;
    const facts = [];
    if ("status" in output) facts.push(["HTTP status", output.status]);
    if ("command" in output) facts.push(["Command", output.command]);
    if (output.truncated) facts.push(["Truncated", `yes (${output.bytes ?? output.rows_affected} in all)`]);
    answer.replaceChildren(...facts.flatMap(([term, value]) => [T.el("dt", term), T.el("dd", value)]));
    if ("body" in output) {
      const base64 = output.encoding === "base64";
      body.textContent = base64 ? `(base64) ${output.body}` : pretty(output.body, output.content_type);
      body.hidden = false;
    }
    if (Array.isArray(output.rows) && output.columns.length) {
      rows.querySelector("thead tr").replaceChildren(...output.columns.map((c) => T.el("th", c)));
      rows.querySelector("tbody").replaceChildren(...output.rows.map((row) =>
        T.row(row.map((value) => (typeof value === "string" ? value : JSON.stringify(value))))));
      rows.hidden = false;
    }
  }

  function showLog(log) {
    const lines = log.lines.map((line) => `${line.at} ${line.level} ${line.message}`);
    if (log.dropped) lines.push(`(${log.dropped} more lines were not kept)`);
    document.getElementById("log").textContent = lines.length ? lines.join("\n") : "Nothing logged.";
  }

  function showHooks(page) {
    const rows = page.items.map((one) => T.row([
      one.event,
      `${one.is_default ? "default " : ""}${one.hook}`,
      one.action.kind === "http" ? `POST ${one.action.args.url}` : `trigger ${one.action.job}`,
      T.badge(one.status),
      one.attempts,
      one.last_error || (one.answer ? JSON.stringify(one.answer) : ""),
    ]));
    document.querySelector("#hooks tbody").replaceChildren(...rows);
    document.getElementById("no-hooks").hidden = rows.length > 0;
  }

  async function load() {
    try {
      const run = await T.api(path);
      showFacts(run);
      showAttempts(run.attempt_times);
      showOutput(run.output);
      const [log, hooks] = await Promise.all([T.api(`${path}/log`), T.api(`${path}/hooks`)]);
      showLog(log);
      showHooks(hooks);
      ended = run.status !== "running";
      document.getElementById("cancel-form").hidden = ended;
      T.showError(null);
    } catch (error) {
      T.showError(error);
    }
  }

  document.getElementById("cancel-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const reason = document.getElementById("cancel-reason").value.trim();
    notice("");
    try {
      const answer = await T.api(`${path}/cancel`, {
        method: "POST", body: reason ? { reason, by: "dashboard" } : { by: "dashboard" },
      });
      notice(`Cancelling: ${answer.detail}.`);
      await load();
    } catch (error) {
      T.showError(error);
    }
  });

  T.offerActions();
  load();
  // Refreshed while it runs (and a little after: its hooks go out after it ends).
  let after = 5;
  const timer = setInterval(() => {
    if (ended && --after < 0) clearInterval(timer);
    else load();
  }, REFRESH_MS);
})();
