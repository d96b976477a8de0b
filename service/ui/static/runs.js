// Runs across every job, newest first: GET /v1/runs with the filters as its query, a page
// at a time through the API's cursor, refreshed in place every few seconds.
"use strict";

(() => {
  const T = window.Tickgate;
  const REFRESH_MS = 5000;
  const PER_PAGE = 50;
  const DAY_MS = 86_400_000;
  const form = document.getElementById("filters");
  const body = document.querySelector("#runs tbody");
  const pager = T.pager(load);
  // Loads overlap (a refresh, a filter typed meanwhile): only the latest one is shown.
  let latest = 0;

  function query() {
    const params = new URLSearchParams({ limit: String(PER_PAGE) });
    const fields = new FormData(form);
    if (fields.get("status")) params.set("status", fields.get("status"));
    if (fields.get("job")) params.set("job", fields.get("job").trim());
    if (fields.get("recent")) params.set("since", new Date(Date.now() - DAY_MS).toISOString());
    const cursor = pager.current();
    if (cursor) params.set("cursor", cursor);
    return params;
  }

  function runRow(run) {
    const link = T.el("a", run.job);
    link.href = `${T.root}/ui/jobs/${encodeURIComponent(run.job)}`;
    const tick = T.el("a", T.absolute(run.scheduled_for));
    tick.href = `${T.root}/ui/runs/${encodeURIComponent(run.id)}`;
    return T.row([
      link,
      tick,
      T.badge(run.status),
      run.trigger,
      T.when(run.started_at),
      run.duration_ms === null ? "" : `${run.duration_ms} ms`,
      run.attempts,
      run.runner,
      run.error || run.skip_reason || "",
    ]);
  }

  async function load() {
    const mine = ++latest;
    try {
      const page = await T.api(`/v1/runs?${query()}`);
      if (mine !== latest) return;
      body.replaceChildren(...page.items.map(runRow));
      document.getElementById("empty").hidden = page.items.length > 0;
      pager.show(page.next_cursor);
      document.getElementById("updated").textContent = `Updated ${new Date().toLocaleTimeString()}.`;
      T.showError(null);
    } catch (error) {
      if (mine === latest) T.showError(error);
    }
  }

  function filtersChanged() {
    pager.reset();
    const params = new URLSearchParams();
    for (const [key, value] of new FormData(form)) if (value) params.set(key, value);
    T.showInAddress(params);
    load();
  }

  T.restoreFilters(form);
  T.watchFilters(form, filtersChanged);
  load();
  setInterval(load, REFRESH_MS);
})();
