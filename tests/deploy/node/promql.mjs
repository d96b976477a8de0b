// Reads {name: PromQL expression} as JSON on stdin; writes {name: [text around each syntax
// error]} for the expressions Prometheus' grammar (lezer-promql) finds errors in.
import { parser } from "@prometheus-io/lezer-promql";
import { readFileSync } from "node:fs";

const expressions = JSON.parse(readFileSync(0, "utf8"));
const problems = {};
for (const [name, expression] of Object.entries(expressions)) {
  const errors = [];
  parser.parse(expression).iterate({
    enter(node) {
      if (node.type.isError) errors.push(expression.slice(Math.max(0, node.from - 20), node.to + 20));
    },
  });
  if (errors.length) problems[name] = errors;
}
process.stdout.write(JSON.stringify(problems));
