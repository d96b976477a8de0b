// New job, Edit and Clone: a form over the job body (the arguments' fields generated from
// the task's args_schema) and a JSON tab holding the same body. The API judges every
// value: its 422 problems are shown beside their fields. Saving an edit sends PATCH with
// If-Match; a 412 shows what changed meanwhile and offers reload or overwrite.
"use strict";

(() => {
  const T = window.Tickgate;
  const $ = (id) => document.getElementById(id);
  const editing = $("editor").dataset.job || null; // the job's name, or null: a new job
  const clone = new URLSearchParams(window.location.search).get("clone");
  const TAGS = { schedule: new Set(["cron", "interval", "daily", "once"]), action: new Set(["http", "trigger"]) };
  const EVENTS = ["failure", "success", "recovery", "misfire", "skip"];
  let schemas = {}; // task name: its args_schema
  let opened = null; // the job as opened (edit and clone)
  // The body last put into the form: what the form has no field for (max_runs, capture...)
  // is kept from it, so a trip through the JSON tab loses nothing and drops what it drops.
  let shown = {};
  let etag = null;

  // ---- calls that need the answer's status and headers -------------------------------

  async function request(path, { method = "GET", body, headers = {} } = {}) {
    const sent = { Accept: "application/json", ...headers };
    if (T.token()) sent.Authorization = `Bearer ${T.token()}`;
    if (body !== undefined) sent["Content-Type"] = "application/json";
    const response = await fetch(T.root + path, {
      method, headers: sent, cache: "no-store", body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 401) T.askForToken();
    const text = await response.text();
    let parsed = null;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch (_notJson) {
      parsed = { detail: text };
    }
    return { status: response.status, etag: response.headers.get("etag"), body: parsed };
  }

  const parsedOr = (text) => T.argsForm.parsedOr(text);

  function showArgs(task, args) {
    T.argsForm.render($("args"), schemas[task], args);
  }

  const readArgs = () => T.argsForm.read($("args"));

  // ---- the whole body -----------------------------------------------------------------

  const utcOf = (id) => ($(id).value ? `${$(id).value}${$(id).value.length === 16 ? ":00" : ""}Z` : null);
  const localOf = (iso) => (iso ? iso.replace(/Z$|[+-]\d\d:\d\d$/, "").slice(0, 19) : "");

  // The wall time in `zone` of the instant `iso` (a once schedule is stored as an instant
  // but shown and sent as a wall time in the job's zone).
  function wallIn(iso, zone) {
    if (!iso) return "";
    try {
      const parts = Object.fromEntries(new Intl.DateTimeFormat("en-US", {
        timeZone: zone, hourCycle: "h23", year: "numeric", month: "2-digit", day: "2-digit",
        hour: "2-digit", minute: "2-digit", second: "2-digit",
      }).formatToParts(new Date(iso)).map((part) => [part.type, part.value]));
      return `${parts.year}-${parts.month}-${parts.day}T${parts.hour}:${parts.minute}:${parts.second}`;
    } catch (_unknownZone) {
      return localOf(iso);
    }
  }
  const number = (id) => ($(id).value === "" ? undefined : Number($(id).value));

  function scheduleOf() {
    const kind = $("f-kind").value;
    if (kind === "cron") return { kind, expression: $("f-expression").value.trim() };
    if (kind === "interval") {
      const schedule = { kind, every_seconds: number("f-every") };
      if ($("f-anchor").value) schedule.anchor = utcOf("f-anchor");
      return schedule;
    }
    if (kind === "daily") {
      const at = $("f-times").value.split(",").map((t) => t.trim()).filter(Boolean);
      const schedule = { kind, at, every_days: number("f-every-days") ?? 1 };
      if ($("f-anchor-date").value) schedule.anchor_date = $("f-anchor-date").value;
      return schedule;
    }
    return { kind, at: $("f-at").value };
  }

  function labelsOf() {
    const lines = $("f-labels").value.split("\n").map((l) => l.trim()).filter(Boolean);
    return Object.fromEntries(lines.map((line) => {
      const at = line.indexOf("=");
      return at < 0 ? [line, ""] : [line.slice(0, at).trim(), line.slice(at + 1).trim()];
    }));
  }

  function bodyOfForm() {
    const kept = shown;
    const body = {
      name: $("f-name").value.trim(),
      description: $("f-description").value,
      schedule: scheduleOf(),
      timezone: $("f-timezone").value.trim() || "UTC",
      task: $("f-task").value,
      args: readArgs(),
      overlap: $("f-overlap").value,
      timeout_seconds: number("f-timeout"),
      misfire_grace_seconds: number("f-grace"),
      catchup: $("f-catchup").value,
      jitter_seconds: number("f-jitter"),
      retry: {
        ...(kept.retry || {}),
        max_attempts: number("f-attempts"),
        min_backoff_seconds: number("f-min-backoff"),
        max_backoff_seconds: number("f-max-backoff"),
        max_doublings: number("f-doublings"),
        max_retry_seconds: number("f-retry-for"),
      },
      start_at: utcOf("f-start"),
      end_at: utcOf("f-end"),
      labels: labelsOf(),
      hooks: readHooks(),
    };
    for (const key of ["max_runs", "managed_by", "capture", "default_hooks"]) {
      if (kept[key] !== undefined) body[key] = kept[key];
    }
    return JSON.parse(JSON.stringify(body)); // drops what is undefined, as JSON would
  }

  function fill(job) {
    shown = job;
    const schedule = job.schedule || { kind: "cron", expression: "" };
    $("f-name").value = job.name || "";
    $("f-description").value = job.description || "";
    $("f-kind").value = schedule.kind;
    $("f-expression").value = schedule.expression || "";
    $("f-seconds").checked = (schedule.expression || "").trim().split(/\s+/).length === 6;
    $("f-every").value = schedule.every_seconds ?? "";
    $("f-anchor").value = localOf(schedule.anchor);
    const daily = schedule.kind === "daily";
    $("f-times").value = daily ? schedule.at.map((t) => t.replace(/^(\d\d:\d\d):00$/, "$1")).join(", ") : "";
    $("f-every-days").value = schedule.every_days ?? 1;
    $("f-anchor-date").value = (daily && schedule.anchor_date) || "";
    $("f-at").value = schedule.kind === "once" ? wallIn(schedule.at, job.timezone || "UTC") : "";
    $("f-timezone").value = job.timezone || "UTC";
    $("f-task").value = job.task || $("f-task").value;
    showArgs($("f-task").value, job.args || {});
    $("f-overlap").value = job.overlap || "skip";
    $("f-timeout").value = job.timeout_seconds ?? 600;
    $("f-grace").value = job.misfire_grace_seconds ?? 60;
    $("f-catchup").value = job.catchup || "latest";
    $("f-jitter").value = job.jitter_seconds ?? 0;
    const retry = job.retry || {};
    $("f-attempts").value = retry.max_attempts ?? 1;
    $("f-min-backoff").value = retry.min_backoff_seconds ?? 5;
    $("f-max-backoff").value = retry.max_backoff_seconds ?? 3600;
    $("f-doublings").value = retry.max_doublings ?? 5;
    $("f-retry-for").value = retry.max_retry_seconds ?? 0;
    $("f-start").value = localOf(job.start_at);
    $("f-end").value = localOf(job.end_at);
    $("f-labels").value = Object.entries(job.labels || {}).map(([k, v]) => `${k}=${v}`).join("\n");
    showHooks(job.hooks || []);
    showKind();
    previewSoon();
  }

  const DECLARED = ["name", "description", "schedule", "timezone", "task", "args", "overlap",
    "timeout_seconds", "misfire_grace_seconds", "retry", "start_at", "end_at", "max_runs",
    "jitter_seconds", "catchup", "managed_by", "labels", "capture", "hooks", "default_hooks"];

  const declared = (job) => Object.fromEntries(DECLARED.filter((k) => k in job).map((k) => [k, job[k]]));

  // ---- hooks: a card each, its webhook's fields those of the http task -----------------

  // Rendered again, from what the cards hold, whenever one is removed: each control's
  // `data-loc` is its hook's index, where the API's problems point.
  function showHooks(hooks) {
    $("hook-list").replaceChildren(...hooks.map(hookCard));
  }

  function hookCard(hook, index) {
    const id = (part) => `hook-${index}-${part}`;
    const at = (part) => `hooks.${index}.${part}`;
    const card = T.el("fieldset", null, "hook");
    card.dataset.kept = JSON.stringify(hook); // what the fields do not show: the retry's rest
    card.append(T.el("legend", `Hook ${index + 1}`), hookEvents(hook, id, at));
    const action = hook.action || { kind: "http", args: {} };
    const kind = control("select", id("kind"), at("action.kind"), "Action");
    kind.control.append(...[["http", "call a webhook (http)"], ["trigger", "run another job"]].map(([value, words]) =>
      Object.assign(T.el("option", words), { value })));
    kind.control.value = action.kind;
    const http = T.el("div");
    http.id = id("http");
    T.argsForm.render(http, schemas.http, action.kind === "http" ? action.args : {}, { prefix: at("action.args"), ids: `h${index}` });
    const trigger = T.el("div");
    trigger.id = id("trigger");
    const job = control("input", id("job"), at("action.job"), "Job to run");
    Object.assign(job.control, { type: "text", value: action.job || "", autocomplete: "off" });
    job.control.setAttribute("list", "job-names");
    const args = control("textarea", id("args"), at("action.args"), "Its arguments instead of its own (JSON, optional)");
    args.control.value = action.kind === "trigger" && action.args ? JSON.stringify(action.args, null, 2) : "";
    trigger.append(job.wrap, args.wrap);
    const showAction = () => {
      http.hidden = kind.control.value !== "http";
      trigger.hidden = !http.hidden;
    };
    kind.control.addEventListener("change", showAction);
    showAction();
    const attempts = control("input", id("attempts"), at("retry.max_attempts"), "Delivery attempts");
    // Left empty on a new hook, the API's default retry for hooks applies (5 attempts).
    Object.assign(attempts.control, { type: "number", min: "1", value: (hook.retry || {}).max_attempts ?? "", placeholder: "default: 5" });
    const remove = Object.assign(T.el("button", `Remove hook ${index + 1}`, "small"), { type: "button", id: id("remove") });
    remove.addEventListener("click", () => {
      showHooks(readHooks().filter((_, other) => other !== index));
      $("add-hook").focus();
    });
    card.append(kind.wrap, http, trigger, attempts.wrap, remove);
    return card;
  }

  function hookEvents(hook, id, at) {
    const events = T.el("fieldset", null, "events");
    events.dataset.loc = at("on");
    events.append(T.el("legend", "On"), ...EVENTS.map((event) => {
      const box = Object.assign(T.el("input"), { type: "checkbox", id: id(`on-${event}`), checked: (hook.on || []).includes(event) });
      const label = T.el("label", ` ${event}`);
      label.prepend(box);
      return label;
    }));
    return events;
  }

  // A labelled control in its `.field`, with the `data-loc` its problems point at.
  function control(tag, id, loc, words) {
    const made = T.el(tag);
    Object.assign(made, { id });
    made.dataset.loc = loc;
    const label = T.el("label", words);
    label.htmlFor = id;
    const wrap = T.el("div", null, "field");
    wrap.append(label, made);
    return { control: made, wrap };
  }

  function readHooks() {
    return [...$("hook-list").children].map((card, index) => {
      const kept = JSON.parse(card.dataset.kept);
      const on = EVENTS.filter((event) => $(`hook-${index}-on-${event}`).checked);
      const kind = $(`hook-${index}-kind`).value;
      const args = $(`hook-${index}-args`).value.trim();
      const action = kind === "http"
        ? { kind, args: T.argsForm.read($(`hook-${index}-http`)) }
        : { kind, job: $(`hook-${index}-job`).value.trim(), ...(args ? { args: parsedOr(args) } : {}) };
      const attempts = number(`hook-${index}-attempts`);
      const retry = attempts === undefined ? kept.retry : { ...(kept.retry || {}), max_attempts: attempts };
      return { ...kept, on, action, ...(retry ? { retry } : {}) };
    });
  }

  // ---- tabs: the form and the JSON, kept in step ---------------------------------------

  function onJsonTab() {
    return !$("json-panel").hidden;
  }

  function body() {
    return onJsonTab() ? parsedOr($("f-json").value) : bodyOfForm();
  }

  function selectTab(json) {
    if (json === onJsonTab()) return;
    if (json) {
      $("f-json").value = JSON.stringify(bodyOfForm(), null, 2);
    } else {
      const parsed = parsedOr($("f-json").value);
      if (typeof parsed !== "object" || parsed === null) {
        $("json-error").textContent = "This is not a JSON object yet: fix it to go back to the form.";
        return;
      }
      $("json-error").textContent = "";
      fill(parsed);
    }
    $("json-panel").hidden = !json;
    $("form-panel").hidden = json;
    for (const [tab, on] of [[$("tab-json"), json], [$("tab-form"), !json]]) {
      tab.setAttribute("aria-selected", String(on));
      tab.tabIndex = on ? 0 : -1;
    }
    (json ? $("tab-json") : $("tab-form")).focus();
  }

  // ---- the schedule, live: in words and its next ticks ---------------------------------

  let previewTimer = null;
  let previewCount = 0;

  function previewSoon() {
    clearTimeout(previewTimer);
    previewTimer = setTimeout(preview, 300);
  }

  function zoneTime(iso, zone) {
    try {
      return new Date(iso).toLocaleString(undefined, { timeZone: zone, timeZoneName: "short" });
    } catch (_unknownZone) {
      return new Date(iso).toISOString();
    }
  }

  async function preview() {
    const mine = ++previewCount;
    const zone = $("f-timezone").value.trim() || "UTC";
    const asked = { schedule: scheduleOf(), timezone: zone, count: 10 };
    const answer = await request("/v1/schedules/preview", { method: "POST", body: asked });
    if (mine !== previewCount) return;
    const words = $("schedule-words");
    const rows = document.querySelector("#preview-ticks tbody");
    if (answer.status !== 200) {
      words.textContent = problemText(answer.body);
      words.className = "field-error";
      rows.replaceChildren();
      return;
    }
    words.textContent = `${answer.body.schedule_text}.`;
    words.className = "";
    rows.replaceChildren(...answer.body.fire_times.map((tick) => {
      const there = T.el("time", zoneTime(tick, zone));
      there.dateTime = tick;
      const here = T.el("time", new Date(tick).toLocaleString());
      here.dateTime = tick;
      return T.row([there, here]);
    }));
  }

  function showKind() {
    for (const node of document.querySelectorAll("[data-kind]")) {
      node.hidden = node.dataset.kind !== $("f-kind").value;
    }
  }

  // ---- problems, beside their fields --------------------------------------------------

  function problemText(problem) {
    if (!problem) return "The server did not answer.";
    if (Array.isArray(problem.errors)) return problem.errors.map((e) => `${e.loc.join(".")}: ${e.msg}`).join("; ");
    return problem.detail || JSON.stringify(problem);
  }

  function clearProblems() {
    for (const node of document.querySelectorAll(".field-problem")) node.remove();
    for (const node of document.querySelectorAll("[aria-invalid]")) {
      node.removeAttribute("aria-invalid");
      const described = (node.getAttribute("aria-describedby") || "").split(" ").filter((id) => !id.startsWith("problem-"));
      if (described.length) node.setAttribute("aria-describedby", described.join(" "));
      else node.removeAttribute("aria-describedby");
    }
    $("problems").hidden = true;
    $("json-error").textContent = "";
  }

  // Where a problem's `loc` points in the form: its field, or the nearest one holding it.
  function fieldAt(loc) {
    // Without the tags pydantic puts after a union (schedule.cron.expression).
    let path = loc.slice(1).map(String).filter((part, at, all) => !(TAGS[all[at - 1]] || new Set()).has(part));
    for (; path.length; path = path.slice(0, -1)) {
      const found = document.querySelector(`#form-panel [data-loc="${CSS.escape(path.join("."))}"]`);
      if (found) return found;
    }
    return null;
  }

  function showProblems(problem) {
    clearProblems();
    const loose = [];
    (problem.errors || []).forEach((error, index) => {
      const target = onJsonTab() ? null : fieldAt(error.loc);
      if (!target) {
        loose.push(`${error.loc.join(".")}: ${error.msg}`);
        return;
      }
      const note = T.el("p", error.msg, "field-error field-problem");
      note.id = `problem-${index}`;
      const control = target.matches("input, select, textarea") ? target : target.querySelector("input, select, textarea") || target;
      control.setAttribute("aria-invalid", "true");
      control.setAttribute("aria-describedby", `${control.getAttribute("aria-describedby") || ""} ${note.id}`.trim());
      (target.closest(".field") || target).append(note);
    });
    if (!problem.errors) loose.push(problem.detail || "");
    $("problems").textContent = loose.length ? loose.join("; ") : "Some values are refused: see beside their fields.";
    $("problems").hidden = false;
    const first = document.querySelector("[aria-invalid]");
    if (first) first.focus();
  }

  // ---- saving ------------------------------------------------------------------------

  async function save(force = false) {
    clearProblems();
    $("conflict").hidden = true;
    const sent = body();
    if (typeof sent !== "object" || sent === null || Array.isArray(sent)) {
      $("json-error").textContent = "The JSON tab must hold one JSON object.";
      return;
    }
    let answer;
    if (editing) {
      const patch = replacing(declared(opened), sent);
      delete patch.name;
      const headers = force || !etag ? {} : { "If-Match": etag };
      answer = await request(`/v1/jobs/${encodeURIComponent(editing)}`, { method: "PATCH", body: patch, headers });
    } else {
      answer = await request("/v1/jobs", { method: "POST", body: sent });
    }
    if (answer.status === 200 || answer.status === 201) {
      window.location.assign(`${T.root}/ui/jobs/${encodeURIComponent(answer.body.name)}`);
    } else if (answer.status === 412) {
      await conflict();
    } else if (answer.status === 422) {
      showProblems(answer.body);
    } else {
      $("problems").textContent = `${answer.status}: ${problemText(answer.body)}`;
      $("problems").hidden = false;
    }
  }

  // A merge patch (what PATCH takes) that makes `stored` into `mine`: what `mine` lacks
  // is null (deleted), objects in both are patched in turn, anything else replaces.
  function replacing(stored, mine) {
    const patch = {};
    for (const key of Object.keys(stored)) if (!(key in mine)) patch[key] = null;
    for (const [key, value] of Object.entries(mine)) {
      const before = stored[key];
      const both = [before, value].every((v) => v && typeof v === "object" && !Array.isArray(v));
      patch[key] = both ? replacing(before, value) : value;
    }
    return patch;
  }

  // Someone changed the job since it was opened: say what, and let the user choose.
  async function conflict() {
    const current = await request(`/v1/jobs/${encodeURIComponent(editing)}`);
    const theirs = declared(current.body);
    const mine = declared(opened);
    const changed = DECLARED.filter((key) => JSON.stringify(theirs[key]) !== JSON.stringify(mine[key]));
    $("theirs").replaceChildren(...changed.map((key) => T.el("li", `${key}: ${JSON.stringify(theirs[key])}`)));
    $("conflict").hidden = false;
    $("reload").onclick = () => {
      opened = theirs;
      etag = current.etag;
      $("conflict").hidden = true;
      fill(theirs);
      if (onJsonTab()) $("f-json").value = JSON.stringify(bodyOfForm(), null, 2);
    };
    $("overwrite").onclick = () => {
      etag = current.etag;
      opened = theirs;
      save();
    };
  }

  // ---- a managed job opens read-only ----------------------------------------------------

  // Usable once filled (typing before would be lost); a managed job's stays read-only.
  function guardManaged(job) {
    $("everything").disabled = Boolean(job.managed_by && !clone);
    if (!job.managed_by || clone) return;
    $("save").disabled = true;
    $("managed-text").textContent = `Managed by ${job.managed_by}: this form is read-only. `;
    $("managed").hidden = false;
    $("edit-anyway").onclick = () => {
      $("everything").disabled = false;
      $("save").disabled = false;
      $("managed-text").textContent = `Managed by ${job.managed_by}: its next apply will put its own definition back, undoing what you save here.`;
      $("edit-anyway").hidden = true;
    };
  }

  // ---- start --------------------------------------------------------------------------

  async function start() {
    const zones = Intl.supportedValuesOf ? Intl.supportedValuesOf("timeZone") : [];
    $("zones").replaceChildren(...["UTC", ...zones].map((zone) => {
      const option = T.el("option");
      option.value = zone;
      return option;
    }));
    const tasks = await T.api("/v1/tasks");
    schemas = Object.fromEntries(tasks.items.map((task) => [task.name, task.args_schema]));
    $("f-task").replaceChildren(...tasks.items.map((task) => T.el("option", task.name)));
    const jobs = await T.api("/v1/jobs?limit=200");
    $("job-names").replaceChildren(...jobs.items.map((job) => Object.assign(T.el("option"), { value: job.name })));
    const source = editing || clone;
    if (source) {
      const found = await request(`/v1/jobs/${encodeURIComponent(source)}`);
      if (found.status !== 200) throw new Error(`${found.status}: ${problemText(found.body)}`);
      opened = declared(found.body);
      etag = editing ? found.etag : null;
      if (clone) {
        opened.name = "";
        delete opened.managed_by;
      }
      fill(opened);
      guardManaged(found.body);
    } else {
      fill({ task: "log" });
      guardManaged({});
    }
  }

  $("f-kind").addEventListener("change", () => {
    showKind();
    previewSoon();
  });
  $("f-seconds").addEventListener("change", () => {
    const fields = $("f-expression").value.trim().split(/\s+/).filter(Boolean);
    if ($("f-seconds").checked && fields.length === 5) fields.unshift("0");
    if (!$("f-seconds").checked && fields.length === 6) fields.shift();
    $("f-expression").value = fields.join(" ");
    previewSoon();
  });
  for (const id of ["f-expression", "f-every", "f-anchor", "f-times", "f-every-days", "f-anchor-date", "f-at", "f-timezone"]) {
    $(id).addEventListener("input", previewSoon);
  }
  $("f-task").addEventListener("change", () => showArgs($("f-task").value, {}));
  $("add-hook").addEventListener("click", () => {
    showHooks([...readHooks(), { on: ["failure"], action: { kind: "http", args: {} } }]);
    $(`hook-${$("hook-list").children.length - 1}-on-failure`).focus();
  });
  $("tab-form").addEventListener("click", () => selectTab(false));
  $("tab-json").addEventListener("click", () => selectTab(true));
  document.querySelector("[role=tablist]").addEventListener("keydown", (event) => {
    if (event.key === "ArrowRight" || event.key === "ArrowLeft") selectTab(!onJsonTab());
  });
  $("job-form").addEventListener("submit", (event) => {
    event.preventDefault();
    save().catch(T.showError);
  });
  start().catch(T.showError);
})();
