// The cluster: GET /v1/cluster's live replicas and the overdue count, refreshed in place.
"use strict";

(() => {
  const T = window.Tickgate;
  const REFRESH_MS = 5000;
  const body = document.querySelector("#members tbody");

  function age(seconds) {
    return seconds === null ? "—" : `${T.duration(seconds)} ago`;
  }

  function memberRow(member) {
    const synced = T.el("span", age(member.last_sync_age_seconds));
    if (member.last_sync) synced.title = member.last_sync;
    const beat = T.el("span", age(member.heartbeat_age_seconds));
    beat.title = member.heartbeat_at;
    return T.row([
      member.runner_id,
      member.version,
      member.tzdata || "—",
      T.when(member.started_at),
      member.runs_in_flight,
      synced,
      beat,
    ]);
  }

  function showOverdue(overdue) {
    const box = document.getElementById("overdue-summary");
    const jobs = overdue.count === 1 ? "1 job" : `${overdue.count} jobs`;
    box.replaceChildren(T.badge(jobs, overdue.count ? "overdue" : "active"), " overdue");
    if (overdue.checked_at) box.append(", as checked ", T.when(overdue.checked_at));
    else box.append(" (not checked yet: a replica checks once per reconcile round)");
    box.dataset.overdue = String(overdue.count);
  }

  async function load() {
    try {
      const cluster = await T.api("/v1/cluster");
      body.replaceChildren(...cluster.members.map(memberRow));
      document.getElementById("empty").hidden = cluster.members.length > 0;
      showOverdue(cluster.overdue);
      document.getElementById("updated").textContent = `Updated ${new Date().toLocaleTimeString()}.`;
      T.showError(null);
    } catch (error) {
      T.showError(error);
    }
  }

  load();
  setInterval(load, REFRESH_MS);
})();
