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
  let cursors = [null];
  let nextCursor = null;
  let latest = 0;

  function query() {
    const params = new URLSearchParams({ limit: String(PER_PAGE) });
    const fields = new FormData(form);
    if (fields.get("status")) params.set("status", fields.get("status"));
    if (fields.get("job")) params.set("job", fields.get("job").trim());
    if (fields.get("recent")) params.set("since", new Date(Date.now() - DAY_MS).toISOString());
    const cursor = cursors[cursors.length - 1];
    if (cursor) params.set("cursor", cursor);
    return params;
  }

  function runRow(run) {
    const link = T.el("a", run.job);
    link.href = `${T.root}/ui/jobs/${encodeURIComponent(run.job)}`;
    return T.row([
      link,
      T.absolute(run.scheduled_for),
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
      nextCursor = page.next_cursor;
      document.getElementById("next-page").disabled = !nextCursor;
      document.getElementById("first-page").disabled = cursors.length < 2;
      document.getElementById("page-number").textContent = `Page ${cursors.length}`;
      document.getElementById("updated").textContent = `Updated ${new Date().toLocaleTimeString()}.`;
      T.showError(null);
    } catch (error) {
      if (mine === latest) T.showError(error);
    }
  }

  function filtersChanged() {
    cursors = [null];
    const params = new URLSearchParams();
    for (const [key, value] of new FormData(form)) if (value) params.set(key, value);
    const search = params.toString();
    window.history.replaceState(null, "", search ? `?${search}` : window.location.pathname);
    load();
  }

  form.addEventListener("change", filtersChanged);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    filtersChanged();
  });
  let pending = null;
  form.querySelector("input[name=job]").addEventListener("input", () => {
    clearTimeout(pending);
    pending = setTimeout(filtersChanged, 300);
  });
  document.getElementById("next-page").addEventListener("click", () => {
    if (!nextCursor) return;
    cursors.push(nextCursor);
    load();
  });
  document.getElementById("first-page").addEventListener("click", () => {
    cursors = [null];
    load();
  });

  T.restoreFilters(form);
  load();
  setInterval(load, REFRESH_MS);
})();
