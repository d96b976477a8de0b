// The dashboard's shared helpers: the bearer token (sessionStorage: this tab only, never
// a URL or a cookie), calls to the REST API, times in words, and little DOM builders.
"use strict";

const TOKEN_KEY = "tickgate.token";

const Tickgate = {
  root: document.body.dataset.root || "",

  token() {
    return sessionStorage.getItem(TOKEN_KEY);
  },

  // fetch /v1/...: the JSON answer, or an Error carrying the API's own detail text.
  async api(path, options = {}) {
    const headers = { Accept: "application/json" };
    const token = Tickgate.token();
    if (token) headers.Authorization = `Bearer ${token}`;
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(Tickgate.root + path, {
      method: options.method || "GET",
      headers,
      body: options.body === undefined ? undefined : JSON.stringify(options.body),
      cache: "no-store",
    });
    if (response.status === 401) Tickgate.askForToken();
    if (!response.ok) throw new Error(await Tickgate.errorText(response));
    return response.status === 204 ? null : response.json();
  },

  async errorText(response) {
    try {
      const body = await response.json();
      const detail = body.detail;
      if (typeof detail === "string") return `${response.status}: ${detail}`;
      if (Array.isArray(detail)) return `${response.status}: ${detail.map((d) => d.msg).join("; ")}`;
    } catch (_ignored) {
      // not JSON: the status line says enough
    }
    return `${response.status}: ${response.statusText}`;
  },

  askForToken() {
    document.getElementById("token-form").hidden = false;
    document.getElementById("token-input").focus();
  },

  showError(error) {
    const box = document.getElementById("error");
    box.textContent = error ? String(error.message || error) : "";
    box.hidden = !error;
  },

  // Scopes of the token in use (GET /v1/whoami): write actions are offered only with "write".
  async scopes() {
    const me = await Tickgate.api("/v1/whoami");
    return new Set(me.scopes);
  },

  // Show the page's write actions (#actions) only to a token with the "write" scope.
  offerActions() {
    Tickgate.scopes()
      .then((scopes) => {
        const actions = document.getElementById("actions");
        actions.hidden = !scopes.has("write");
        // Says the scopes are known (hidden then means "not allowed", not "not yet").
        actions.dataset.scopes = [...scopes].sort().join(" ");
      })
      .catch(Tickgate.showError);
  },

  el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  },

  row(cells) {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      if (cell instanceof Node) td.append(cell);
      else td.textContent = cell === null || cell === undefined ? "" : String(cell);
      tr.append(td);
    }
    return tr;
  },

  // "3 min", "40 s": a span of time in its largest sensible unit
  duration(seconds) {
    const size = Math.round(Math.abs(seconds));
    return size < 90 ? `${size} s` : size < 5400 ? `${Math.round(size / 60)} min`
      : size < 172800 ? `${Math.round(size / 3600)} h` : `${Math.round(size / 86400)} d`;
  },

  // "in 3 min" / "5 s ago"
  relative(iso) {
    if (!iso) return "";
    const seconds = Math.round((Date.parse(iso) - Date.now()) / 1000);
    const text = Tickgate.duration(seconds);
    return seconds >= 0 ? `in ${text}` : `${text} ago`;
  },

  absolute(iso) {
    return iso ? new Date(iso).toLocaleString() : "";
  },

  // A <time> showing "in 3 min", its exact local time beside it.
  when(iso) {
    if (!iso) return Tickgate.el("span", "—", "muted");
    const node = Tickgate.el("time", Tickgate.relative(iso));
    node.dateTime = iso;
    node.title = iso;
    const wrap = Tickgate.el("span");
    wrap.append(node, Tickgate.el("small", ` ${Tickgate.absolute(iso)}`, "muted"));
    return wrap;
  },

  badge(text, kind) {
    return Tickgate.el("span", text, `badge badge-${kind || text}`);
  },

  // A list page's cursor paging. The API pages forward only, so the cursors of the pages
  // before this one are kept; the page's first/previous/next buttons (those it has) move
  // through them and call `load`, which reads `current()` and then calls `show`.
  pager(load) {
    const pager = {
      cursors: [null],
      nextCursor: null,
      current() {
        return pager.cursors[pager.cursors.length - 1];
      },
      // Back to the first page (the filters changed): the next page's cursor belongs to the
      // old filters, so "Next" is off until `show` gives the new one.
      reset() {
        pager.cursors = [null];
        pager.show(null);
      },
      show(nextCursor) {
        pager.nextCursor = nextCursor;
        const first = pager.cursors.length < 2;
        for (const [id, off] of [["next-page", !nextCursor], ["prev-page", first], ["first-page", first]]) {
          const button = document.getElementById(id);
          if (button) button.disabled = off;
        }
        document.getElementById("page-number").textContent = `Page ${pager.cursors.length}`;
      },
    };
    const on = (id, move) => document.getElementById(id)?.addEventListener("click", () => {
      move();
      load();
    });
    on("next-page", () => pager.nextCursor && pager.cursors.push(pager.nextCursor));
    on("prev-page", () => pager.cursors.length > 1 && pager.cursors.pop());
    on("first-page", pager.reset);
    return pager;
  },

  // A list page's filters: a change, a submit, or a pause in typing calls `changed`, once
  // the form differs from what it was at the last call (or at this one, so call it after
  // restoreFilters). The same filters reach it more than once: typed text is also a
  // "change" when the box loses focus, and a choice made before the pause in typing ends
  // already carries the text. Calling `changed` again would send the pager back to the
  // first page, after the user may have gone on to the next one.
  watchFilters(form, changed) {
    const state = () => {
      const fields = new URLSearchParams();
      for (const field of form.elements) {
        if (!field.name) continue;
        const checkable = field.type === "checkbox" || field.type === "radio";
        fields.append(field.name, checkable ? String(field.checked) : field.value);
      }
      return fields.toString();
    };
    let applied = state();
    let pending = null;
    const apply = () => {
      clearTimeout(pending);
      const now = state();
      if (now === applied) return;
      applied = now;
      changed();
    };
    form.addEventListener("change", apply);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      apply();
    });
    form.addEventListener("input", (event) => {
      if (event.target.type !== "text") return;
      clearTimeout(pending);
      pending = setTimeout(apply, 300);
    });
  },

  // The filters go in the address bar, so that a reload or a shared link keeps them.
  showInAddress(params) {
    const search = params.toString();
    window.history.replaceState(null, "", search ? `?${search}` : window.location.pathname);
  },

  // A list page's filters live in the address bar, so a reload or a shared link keeps
  // them: put them back into the page's form.
  restoreFilters(form) {
    const params = new URLSearchParams(window.location.search);
    for (const field of form.elements) {
      if (!field.name || !params.has(field.name)) continue;
      if (field.type === "checkbox") field.checked = params.get(field.name) === "true";
      else field.value = params.get(field.name);
    }
  },
};

document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token-input").value.trim());
  window.location.reload();
});

const forget = document.getElementById("forget-token");
forget.hidden = !Tickgate.token();
forget.addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  window.location.reload();
});

window.Tickgate = Tickgate;
