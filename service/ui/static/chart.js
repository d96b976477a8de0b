// The job page's chart of its last runs, drawn as SVG here (no library): lateness in
// seconds above, duration in milliseconds below, one point per run, oldest to newest.
// Only attributes and the stylesheet's classes: the CSP allows no inline style.
"use strict";

(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const WIDTH = 640;
  const LEFT = 70;
  const RIGHT = 16;
  const PANEL = 90;
  const FIRST_TOP = 28;
  const SECOND_TOP = FIRST_TOP + PANEL + 44;
  const HEIGHT = SECOND_TOP + PANEL + 44;

  function node(tag, attributes = {}, text) {
    const element = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
    if (text !== undefined) element.textContent = text;
    return element;
  }

  // Three significant digits at most: 0.0123, 1.5, 2340.
  function number(value) {
    return String(Number(value.toPrecision(3)));
  }

  function median(values) {
    const sorted = [...values].sort((a, b) => a - b);
    return sorted.length ? sorted[Math.floor((sorted.length - 1) / 2)] : 0;
  }

  function xOf(index, count) {
    const span = WIDTH - LEFT - RIGHT;
    return LEFT + (count < 2 ? span / 2 : (index * span) / (count - 1));
  }

  // One series in its own panel: axes, its scale from 0 (or its minimum) to its maximum,
  // a line through its points, and a point per run whose exact value is its tooltip.
  function panel(series, top, count) {
    const values = series.points.map((point) => point.value);
    const low = Math.min(0, ...values);
    const high = Math.max(...values, low + 1e-9);
    const yOf = (value) => top + PANEL - ((value - low) / (high - low)) * PANEL;
    const group = node("g", { class: `series ${series.kind}` });
    group.append(
      node("text", { x: LEFT, y: top - 10, class: "chart-label" }, `${series.name} (${series.unit})`),
      node("line", { x1: LEFT, y1: top, x2: LEFT, y2: top + PANEL, class: "axis" }),
      node("line", { x1: LEFT, y1: top + PANEL, x2: WIDTH - RIGHT, y2: top + PANEL, class: "axis" }),
      node("text", { x: LEFT - 6, y: top + 4, class: "tick", "text-anchor": "end" }, number(high)),
      node("text", { x: LEFT - 6, y: top + PANEL, class: "tick", "text-anchor": "end" }, number(low)),
    );
    const xy = series.points.map((point) => [xOf(point.index, count), yOf(point.value)]);
    if (xy.length > 1) {
      group.append(node("polyline", { points: xy.map((p) => p.join(",")).join(" "), class: "line" }));
    }
    series.points.forEach((point, i) => {
      const dot = node("circle", { cx: xy[i][0], cy: xy[i][1], r: 3, class: "point" });
      dot.append(node("title", {}, `${point.when}: ${number(point.value)} ${series.unit}`));
      group.append(dot);
    });
    return group;
  }

  function summary(series) {
    const values = series.points.map((point) => point.value);
    if (!values.length) return `${series.name}: none`;
    const [mid, top] = [median(values), Math.max(...values)];
    return `${series.name}: median ${number(mid)} ${series.unit}, highest ${number(top)} ${series.unit}`;
  }

  // Runs newest first, as the API lists them; skipped ticks never ran and are left out.
  // Lateness counts for scheduled runs only (a manual run is due when asked for).
  function seriesOf(runs) {
    const ran = runs.filter((run) => run.status !== "skipped").reverse();
    const lateness = { name: "Lateness", unit: "s", kind: "lateness", points: [] };
    const duration = { name: "Duration", unit: "ms", kind: "duration", points: [] };
    ran.forEach((run, index) => {
      const when = new Date(run.started_at).toLocaleString();
      if (run.trigger === "schedule") {
        const late = (Date.parse(run.started_at) - Date.parse(run.scheduled_for)) / 1000;
        lateness.points.push({ index, value: late, when });
      }
      if (run.duration_ms !== null) duration.points.push({ index, value: run.duration_ms, when });
    });
    return { ran, lateness, duration };
  }

  function draw(svg, runs) {
    const { ran, lateness, duration } = seriesOf(runs);
    const count = ran.length;
    const label = `Lateness and duration of the last ${count} runs, oldest to newest. `
      + `${summary(lateness)}. ${summary(duration)}.`;
    svg.setAttribute("viewBox", `0 0 ${WIDTH} ${HEIGHT}`);
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", label);
    svg.dataset.runs = String(count);
    const parts = [node("title", {}, label)];
    if (count) {
      parts.push(panel(lateness, FIRST_TOP, count), panel(duration, SECOND_TOP, count));
      const bottom = SECOND_TOP + PANEL + 16;
      parts.push(
        node("text", { x: LEFT, y: bottom, class: "tick" }, new Date(ran[0].started_at).toLocaleString()),
        node("text", { x: WIDTH - RIGHT, y: bottom, class: "tick", "text-anchor": "end" },
          new Date(ran[count - 1].started_at).toLocaleString()),
        node("text", { x: (WIDTH + LEFT) / 2, y: bottom + 20, class: "chart-label", "text-anchor": "middle" },
          `the last ${count} runs, oldest to newest (started at)`),
      );
    }
    svg.replaceChildren(...parts);
  }

  window.Tickgate.chart = { draw };
})();
