// The arguments' fields of a job, generated from its task's JSON schema (GET /v1/tasks):
// required fields marked, enums as choices, numbers, booleans, nested objects as groups,
// maps (`Name: value`) and lists one entry a line, anything else as JSON. Each control
// carries `data-loc` (args.<path>), where the API's 422 problems point. Shared by the job
// form (edit.js) and "Run with arguments" (job.js).
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
    if (schema.type === "object" && schema.additionalProperties) return "map";
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
    if (shape === "map" || shape === "list" || shape === "json") {
      const area = T.el("textarea");
      area.rows = 3;
      area.spellcheck = false;
      return area;
    }
    const box = T.el("input");
    box.type = { bool: "checkbox", number: "number" }[shape] || (schema.format === "uri" ? "url" : "text");
    if (shape === "number") box.step = "any";
    return box;
  }

  function show(control, shape, value) {
    if (value === undefined || value === null) value = undefined;
    if (shape === "bool") control.checked = Boolean(value);
    else if (shape === "map") {
      control.value = Object.entries(value || {}).map(([k, v]) => `${k}: ${v}`).join("\n");
    } else if (shape === "list") control.value = (value || []).join("\n");
    else if (shape === "json") control.value = value === undefined ? "" : JSON.stringify(value, null, 2);
    else control.value = value === undefined ? "" : String(value);
  }

  function readOne(control) {
    const shape = control.dataset.shape;
    const text = control.value;
    if (shape === "bool") return control.checked || control.dataset.default === "true" ? control.checked : undefined;
    if (shape === "map") {
      const lines = text.split("\n").filter((line) => line.trim());
      if (!lines.length) return undefined;
      return Object.fromEntries(lines.map((line) => {
        const at = line.indexOf(":");
        return at < 0 ? [line.trim(), ""] : [line.slice(0, at).trim(), line.slice(at + 1).trim()];
      }));
    }
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

  function fields(root, schema, value, path) {
    const required = new Set(schema.required || []);
    return Object.entries(schema.properties || {}).map(([key, raw]) =>
      field(root, raw, (value || {})[key], [...path, key], required.has(key)));
  }

  function field(root, raw, value, path, required) {
    const schema = resolve(raw, root);
    const title = `${raw.title || schema.title || path[path.length - 1]}${required ? " (required)" : ""}`;
    const loc = ["args", ...path].join(".");
    if (schema.type === "object" && schema.properties) {
      const group = T.el("fieldset", null, "nested");
      group.dataset.loc = loc;
      group.append(T.el("legend", title), ...fields(root, schema, value, path));
      return group;
    }
    const shape = shapeOf(schema);
    const control = input(shape, schema, required);
    control.id = `a-${path.join("-")}`;
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
    const hint = { map: "One `Name: value` a line.", list: "One a line.", json: "JSON." }[shape];
    if (help || hint) {
      const small = T.el("small", [help, hint].filter(Boolean).join(" "), "muted");
      small.id = `${control.id}-help`;
      control.setAttribute("aria-describedby", small.id);
      wrap.append(small);
    }
    return wrap;
  }

  // Fill `container` with the fields of `schema` (none without one), showing `value`.
  function render(container, schema, value) {
    container.replaceChildren(...(schema ? fields(schema, schema, value || {}, []) : []));
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
    }
    return args;
  }

  T.argsForm = { render, read, parsedOr };
})();
