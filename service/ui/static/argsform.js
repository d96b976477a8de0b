// The arguments' fields of a job, generated from its task's JSON schema (GET /v1/tasks):
// required fields marked, enums as choices, numbers, booleans, nested objects as groups,
// maps as name and value rows, lists one entry a line, anything else as JSON. Secrets are
// masked: a `writeOnly` or `password` string, and the map entries its schema's
// `x-secret-names` field lists (the http task's secret headers; a stored one shows "***",
// which the API keeps). Each control carries `data-loc` (<prefix>.<path>), where the API's
// 422 problems point. Shared by the job form's arguments and hooks (edit.js) and "Run with
// arguments" (job.js).
"use strict";

(() => {
  const T = window.Tickgate;

  function resolve(schema, root) {
    const named = schema && schema.$ref ? root.$defs[schema.$ref.split("/").pop()] : schema;
    const options = (named && named.anyOf) || [];
    const present = options.filter((option) => option.type !== "null");
    return present.length === 1 && options.length === 2 ? resolve(present[0], root) : named || {};
  }

  function shapeOf(schema) {
    if (schema.enum) return "choice";
    if (schema.type === "boolean") return "bool";
    if (schema.type === "integer" || schema.type === "number") return "number";
    if (schema.type === "string") return "text";
    const values = schema.type === "object" && schema.additionalProperties;
    if (values && values.type === "string") return "pairs"; // names to text: headers, say
    if (schema.type === "array" && schema.items && ["string", "integer"].includes(schema.items.type)) {
      return "list";
    }
    return "json";
  }

  function input(shape, schema, required) {
    if (shape === "choice") {
      const select = T.el("select");
      if (!required || schema.default !== undefined) {
        const unset = T.el("option", schema.default === undefined ? "(none)" : `(default: ${schema.default})`);
        unset.value = "";
        select.append(unset);
      }
      select.append(...schema.enum.map((value) => T.el("option", value)));
      return select;
    }
    if (shape === "list" || shape === "json") {
      const area = T.el("textarea");
      area.rows = 3;
      area.spellcheck = false;
      return area;
    }
    const box = T.el("input");
    box.type = { bool: "checkbox", number: "number" }[shape] || (schema.format === "uri" ? "url" : "text");
    if (schema.writeOnly || schema.format === "password") masked(box, true);
    if (shape === "number") {
      box.step = schema.type === "integer" ? "1" : "any";
      const low = schema.minimum ?? schema.exclusiveMinimum;
      const high = schema.maximum ?? schema.exclusiveMaximum;
      if (low !== undefined) box.min = String(low);
      if (high !== undefined) box.max = String(high);
    }
    return box;
  }

  function show(control, shape, value) {
    if (value === undefined || value === null) value = undefined;
    if (shape === "bool") control.checked = Boolean(value);
    else if (shape === "list") control.value = (value || []).join("\n");
    else if (shape === "json") control.value = value === undefined ? "" : JSON.stringify(value, null, 2);
    else control.value = value === undefined ? "" : String(value);
  }

  function readOne(control) {
    const shape = control.dataset.shape;
    const text = control.value;
    if (shape === "bool") return control.checked || control.dataset.default === "true" ? control.checked : undefined;
    if (shape === "pairs") return pairsOf(control);
    if (shape === "list") {
      const items = text.split("\n").map((line) => line.trim()).filter(Boolean);
      const numeric = control.dataset.items === "integer";
      return items.length ? items.map((item) => (numeric && /^-?\d+$/.test(item) ? Number(item) : item)) : undefined;
    }
    if (text.trim() === "") return undefined;
    if (shape === "number") return Number.isNaN(Number(text)) ? text : Number(text);
    if (shape === "json") return parsedOr(text);
    return text;
  }

  // JSON if it parses; else the text as it is, for the API to say what is wrong with it.
  function parsedOr(text) {
    try {
      return JSON.parse(text);
    } catch (_notJson) {
      return text; // the API says what is wrong with it
    }
  }

  // The map fields' secret-name lists are kept by the map's rows, not shown on their own.
  function fields(where, schema, value, path) {
    const required = new Set(schema.required || []);
    const properties = Object.entries(schema.properties || {});
    const kept = new Set(properties.map(([, raw]) => raw["x-secret-names"]).filter(Boolean));
    return properties.filter(([key]) => !kept.has(key)).map(([key, raw]) =>
      field(where, raw, value || {}, [...path, key], required.has(key)));
  }

  function field(where, raw, parent, path, required) {
    const schema = resolve(raw, where.root);
    const key = path[path.length - 1];
    const value = parent[key];
    const title = `${raw.title || schema.title || key}${required ? " (required)" : ""}`;
    const loc = [where.prefix, ...path].join(".");
    if (schema.type === "object" && schema.properties) {
      const group = T.el("fieldset", null, "nested");
      group.dataset.loc = loc;
      group.append(T.el("legend", title), ...fields(where, schema, value, path));
      return group;
    }
    const shape = shapeOf(schema);
    const id = `${where.ids}-${path.join("-")}`;
    if (shape === "pairs") return pairs(id, title, loc, path, value, parent[raw["x-secret-names"]], raw);
    const control = input(shape, schema, required);
    control.id = id;
    Object.assign(control.dataset, { shape, loc, path: JSON.stringify(path) });
    if (shape === "list") control.dataset.items = schema.items.type;
    show(control, shape, value);
    if (schema.default !== undefined && schema.default !== null && shape !== "choice") {
      control.placeholder = `default: ${typeof schema.default === "object" ? JSON.stringify(schema.default) : schema.default}`;
    }
    if (shape === "bool") control.dataset.default = String(Boolean(schema.default));
    const label = T.el("label", title);
    label.htmlFor = control.id;
    const wrap = T.el("div", null, shape === "bool" ? "field check" : "field");
    wrap.append(label, control);
    const help = raw.description || schema.description;
    const hint = shape === "number" ? bounds(schema) : { list: "One a line.", json: "JSON." }[shape];
    if (help || hint) {
      const small = T.el("small", [help, hint].filter(Boolean).join(" "), "muted");
      small.id = `${control.id}-help`;
      control.setAttribute("aria-describedby", small.id);
      wrap.append(small);
    }
    return wrap;
  }

  // A number's bounds in words ("from 0 to 3600", "above 0"): the API holds to them.
  function bounds(schema) {
    const words = [];
    if (schema.minimum !== undefined) words.push(`from ${schema.minimum}`);
    if (schema.exclusiveMinimum !== undefined) words.push(`above ${schema.exclusiveMinimum}`);
    if (schema.maximum !== undefined) words.push(`to ${schema.maximum}`);
    if (schema.exclusiveMaximum !== undefined) words.push(`below ${schema.exclusiveMaximum}`);
    return words.length ? `${words.join(" ")}.` : undefined;
  }

  // ---- maps: a row of name and value each, a value masked when it is a secret ---------

  function masked(box, secret) {
    box.type = secret ? "password" : "text";
    box.autocomplete = secret ? "new-password" : "off";
  }

  function pairs(id, title, loc, path, value, secretNames, raw) {
    const group = T.el("fieldset", null, "nested pairs");
    Object.assign(group.dataset, { shape: "pairs", loc, path: JSON.stringify(path), next: "0" });
    group.id = id;
    if (raw["x-secret-names"]) group.dataset.secrets = raw["x-secret-names"];
    const add = T.el("button", "Add", "small pairs-add");
    add.type = "button";
    add.id = `${id}-add`;
    add.setAttribute("aria-label", `Add to ${title}`);
    add.addEventListener("click", () => {
      group.insertBefore(pair(group, "", "", false), add);
      group.querySelector(".pair:last-of-type input").focus();
    });
    const secret = new Set((secretNames || []).map((name) => name.toLowerCase()));
    group.append(T.el("legend", title), ...Object.entries(value || {}).map(([name, text]) =>
      pair(group, name, text, secret.has(name.toLowerCase()))), add);
    if (raw.description) group.append(T.el("small", raw.description, "muted"));
    return group;
  }

  function pair(group, name, text, secret) {
    const n = Number(group.dataset.next);
    group.dataset.next = String(n + 1);
    const row = T.el("div", null, "pair");
    const labelled = (kind, control, words) => {
      control.id = `${group.id}-${n}-${kind}`;
      control.className = `pair-${kind}`;
      const label = T.el("label", words);
      label.htmlFor = control.id;
      return [label, control];
    };
    const nameBox = Object.assign(T.el("input"), { type: "text", value: name, autocomplete: "off" });
    const valueBox = Object.assign(T.el("input"), { value: String(text) });
    masked(valueBox, secret);
    row.append(...labelled("name", nameBox, "Name"), ...labelled("value", valueBox, "Value"));
    if (group.dataset.secrets) {
      const box = Object.assign(T.el("input"), { type: "checkbox", checked: secret });
      box.addEventListener("change", () => {
        masked(valueBox, box.checked);
        // "***" keeps a stored secret only while it is one: no longer secret, it is typed anew.
        if (!box.checked && valueBox.value === "***") valueBox.value = "";
      });
      const [label, control] = labelled("secret", box, "secret");
      label.className = "check";
      label.prepend(control);
      row.append(label);
    }
    const remove = T.el("button", "Remove", "small");
    remove.type = "button";
    remove.setAttribute("aria-label", `Remove ${name || "this row"}`);
    remove.addEventListener("click", () => {
      row.remove();
      group.querySelector(".pairs-add").focus(); // the focus stays in the group
    });
    row.append(remove);
    return row;
  }

  function pairsOf(group) {
    const rows = [...group.querySelectorAll(".pair")].filter((row) => row.querySelector(".pair-name").value.trim());
    if (!rows.length) return undefined;
    return Object.fromEntries(rows.map((row) => [row.querySelector(".pair-name").value.trim(), row.querySelector(".pair-value").value]));
  }

  function secretsOf(group) {
    return [...group.querySelectorAll(".pair")]
      .filter((row) => row.querySelector(".pair-secret")?.checked && row.querySelector(".pair-name").value.trim())
      .map((row) => row.querySelector(".pair-name").value.trim());
  }

  // Fill `container` with the fields of `schema` (none without one), showing `value`; the
  // controls' problems are found at `prefix` (args) and their ids start `ids` (a).
  function render(container, schema, value, { prefix = "args", ids = "a" } = {}) {
    const where = { root: schema, prefix, ids };
    container.replaceChildren(...(schema ? fields(where, schema, value || {}, []) : []));
  }

  // The args the fields hold: what is left empty is left out.
  function read(container) {
    const args = {};
    for (const control of container.querySelectorAll("[data-shape]")) {
      const value = readOne(control);
      if (value === undefined) continue;
      const path = JSON.parse(control.dataset.path);
      let at = args;
      for (const key of path.slice(0, -1)) at = at[key] = at[key] || {};
      at[path[path.length - 1]] = value;
      const names = control.dataset.secrets && secretsOf(control);
      if (names && names.length) at[control.dataset.secrets] = names;
    }
    return args;
  }

  T.argsForm = { render, read, parsedOr };
})();
