// A TypeScript client of Tickgate, typed from openapi/openapi.json by openapi-typescript and
// calling through openapi-fetch: tests/acceptance/test_ts_client.py type-checks it with
// `tsc --strict` against freshly generated types (./tickgate.d.ts), then runs it against a
// live server. It prints one JSON line of what it saw; any surprise throws.
//
//   node main.js <base-url> <job-name>
import createClient from "openapi-fetch";
import type { components, paths } from "./tickgate.js";

type Job = components["schemas"]["JobOut"];
type Readiness = components["schemas"]["Readiness"];

function check(condition: boolean, what: string): asserts condition {
  if (!condition) {
    throw new Error(what);
  }
}

const [baseUrl, name] = process.argv.slice(2);
check(baseUrl !== undefined && name !== undefined, "usage: node main.js <base-url> <job-name>");
const client = createClient<paths>({ baseUrl });

const ready = await client.GET("/readyz");
const readiness: Readiness | undefined = ready.data;
check(readiness?.status === "ready", `readyz: ${ready.response.status}`);

const body: components["schemas"]["JobCreate"] = {
  name,
  schedule: { kind: "cron", expression: "0 0 1 1 *" },
  task: "log",
  args: { message: "from a TypeScript client" },
};
const created = await client.POST("/v1/jobs", { body });
check(created.data !== undefined, `create: ${created.response.status}`);
const job: Job = created.data;
// A string in the types and on the wire: a JavaScript number would round it.
const lockKey: string = job.lock_key;

const again = await client.POST("/v1/jobs", { body });
check(again.response.status === 409, `duplicate create: ${again.response.status}`);
const conflict = again.error?.detail;
check(typeof conflict === "string" && conflict.includes("already exists"), "409 detail");

const invalid = await client.POST("/v1/jobs", {
  body: { name: "bad-cron", schedule: { kind: "cron", expression: "every day" }, task: "log" },
});
const problems = invalid.error?.detail;
check(invalid.response.status === 422 && Array.isArray(problems), "422 on a bad cron");
const problemLocs = problems.map((problem) => problem.loc.join("."));

const page = await client.GET("/v1/jobs", { params: { query: { limit: 10 } } });
check(page.data !== undefined, `list: ${page.response.status}`);
const shown = await client.GET("/v1/jobs/{name}", { params: { path: { name } } });
check(shown.data !== undefined, `get: ${shown.response.status}`);

const deleted = await client.DELETE("/v1/jobs/{name}", { params: { path: { name } } });
const gone = await client.GET("/v1/jobs/{name}", { params: { path: { name } } });
const missing = gone.error?.detail;
check(typeof missing === "string", "404 detail");

const probe = await fetch(new URL("/healthz", baseUrl), { method: "HEAD" });

console.log(
  JSON.stringify({
    created: created.response.status,
    location: created.response.headers.get("location"),
    lockKey,
    lockKeyAsNumber: String(JSON.parse(`${lockKey}`) as number),
    problemLocs,
    listed: page.data.items.map((item) => [item.name, item.lock_key]),
    shownLockKey: shown.data.lock_key,
    nextRuns: shown.data.next_runs.length,
    deleted: deleted.response.status,
    afterDelete: gone.response.status,
    headHealthz: probe.status,
  }),
);
