// The jobs table: GET /v1/jobs with the filters as its query, a page at a time through the
// API's cursor, refreshed in place every few seconds (filters and scroll position stay).
"use strict";

(() => {
  const T = window.Tickgate;
  const REFRESH_MS = 5000;
  const OVERDUE_BADGES = 1000;
  const form = document.getElementById("filters");
  const body = document.querySelector("#jobs tbody");
  const pager = T.pager(load);
  // Loads overlap (a refresh, a filter typed meanwhile): only the latest one is shown.
  let latest = 0;

  // The overdue jobs are listed in name order only: while that box is ticked, the sort
  // control is off (and a disabled field is left out of the query).
  function syncSort() {
    form.elements.sort.disabled = form.elements.overdue.checked;
  }

  function query() {
    const params = new URLSearchParams();
    for (const [key, value] of new FormData(form)) {
      if (value && !(key === "sort" && value === "name")) params.set(key, value);
    }
    return params;
  }

  function jobRow(job) {
    const link = T.el("a", job.name);
    link.href = `${T.root}/ui/jobs/${encodeURIComponent(job.name)}`;
    const state = T.el("span");
    state.append(T.badge(job.state));
    if (job.overdue) state.append(" ", T.badge("overdue"));
    return T.row([link, job.schedule_text, job.timezone, state, T.when(job.next_run_at), lastRun(job)]);
  }

  function lastRun(job) {
    const run = job.last_run;
    if (!run) return T.el("span", "never", "muted");
    const wrap = T.el("span");
    wrap.append(T.badge(run.status), " ", T.el("small", T.relative(run.started_at), "muted"));
    return wrap;
  }

  async function overdueNames(params) {
    // The API's overdue filter names the overdue jobs; a badge needs them on every page.
    // In name order the same page of overdue jobs covers this page's names. In next-run
    // order a page spans any names: the first OVERDUE_BADGES overdue jobs by name are asked.
    const overdue = new URLSearchParams(params);
    overdue.set("overdue", "true");
    const cursor = pager.current();
    if (overdue.get("sort") === "next_run") {
      overdue.delete("sort");
      overdue.set("limit", String(OVERDUE_BADGES));
    } else {
      overdue.set("limit", params.get("limit") || "50");
      if (cursor) overdue.set("cursor", cursor);
    }
    const page = await T.api(`/v1/jobs?${overdue}`);
    return new Set(page.items.map((job) => job.name));
  }

  async function load() {
    const mine = ++latest;
    const params = query();
    const cursor = pager.current();
    const pageQuery = new URLSearchParams(params);
    if (cursor) pageQuery.set("cursor", cursor);
    try {
      const [page, overdue] = await Promise.all([
        T.api(`/v1/jobs?${pageQuery}`),
        params.get("overdue") ? Promise.resolve(null) : overdueNames(params),
      ]);
      if (mine !== latest) return;
      for (const job of page.items) job.overdue = overdue === null || overdue.has(job.name);
      body.replaceChildren(...page.items.map(jobRow));
      document.getElementById("empty").hidden = page.items.length > 0;
      pager.show(page.next_cursor);
      document.getElementById("updated").textContent = `Updated ${new Date().toLocaleTimeString()}.`;
      T.showError(null);
    } catch (error) {
      if (mine === latest) T.showError(error);
    }
  }

  function filtersChanged() {
    syncSort();
    pager.reset();
    T.showInAddress(query());
    load();
  }

  T.restoreFilters(form);
  T.watchFilters(form, filtersChanged);
  syncSort();
  load();
  setInterval(load, REFRESH_MS);
})();
