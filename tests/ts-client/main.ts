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
// Errors are RFC 9457 problems (application/problem+json), typed like any answer.
const conflict = again.error;
check(conflict?.status === 409 && conflict.type === "about:blank", "409 problem");
check(conflict.detail.includes("already exists"), `409 detail: ${conflict.detail}`);

const invalid = await client.POST("/v1/jobs", {
  body: { name: "bad-cron", schedule: { kind: "cron", expression: "every day" }, task: "log" },
});
const problems = invalid.error;
check(problems !== undefined && "errors" in problems, `422: ${invalid.response.status}`);
const problemLocs = problems.errors.map((problem) => problem.loc.join("."));

const page = await client.GET("/v1/jobs", { params: { query: { limit: 10 } } });
check(page.data !== undefined, `list: ${page.response.status}`);
const shown = await client.GET("/v1/jobs/{name}", { params: { path: { name } } });
check(shown.data !== undefined, `get: ${shown.response.status}`);

// Optimistic concurrency: a change conditioned on a stale ETag is refused (412).
const etag = shown.response.headers.get("etag");
check(etag !== null, "an ETag on GET");
const stale = await client.PATCH("/v1/jobs/{name}", {
  params: { path: { name }, header: { "if-match": '"1-stale"' } },
  body: { description: "lost update" },
});
check(stale.error?.status === 412, `stale If-Match: ${stale.response.status}`);
const fresh = await client.PATCH("/v1/jobs/{name}", {
  params: { path: { name }, header: { "if-match": etag } },
  body: { description: "from TypeScript" },
});
check(fresh.data?.description === "from TypeScript", `If-Match: ${fresh.response.status}`);
const freshTag = fresh.response.headers.get("etag") ?? "";

// Run now with other arguments: that run only, checked against the task's schema.
const triggered = await client.POST("/v1/jobs/{name}/trigger", {
  params: { path: { name } },
  body: { args: { message: "louder, from TypeScript", level: "warning" }, note: "typed" },
});
check(triggered.data !== undefined, `trigger with args: ${triggered.response.status}`);
const badArgs = await client.POST("/v1/jobs/{name}/trigger", {
  params: { path: { name } },
  body: { args: { message: "x", level: "loud" } },
});
// Cancel: a run that has ended answers 409 with its status.
const runId = triggered.data?.id ?? "";
for (let look = 0; look < 100; look += 1) {
  const run = await client.GET("/v1/runs/{run_id}", { params: { path: { run_id: runId } } });
  if (run.data?.status !== "running") break;
  await new Promise((resolve) => setTimeout(resolve, 100));
}
const late = await client.POST("/v1/runs/{run_id}/cancel", {
  params: { path: { run_id: runId } },
  body: { reason: "too late", by: "ts" },
});
const argProblems = badArgs.error;
check(argProblems !== undefined && "errors" in argProblems, `bad args: ${badArgs.response.status}`);

const deleted = await client.DELETE("/v1/jobs/{name}", {
  params: { path: { name }, header: { "if-match": freshTag } },
});
const gone = await client.GET("/v1/jobs/{name}", { params: { path: { name } } });
check(gone.error?.status === 404 && gone.error.detail.includes(name), "404 problem");

const probe = await fetch(new URL("/healthz", baseUrl), { method: "HEAD" });

console.log(
  JSON.stringify({
    created: created.response.status,
    location: created.response.headers.get("location"),
    lockKey,
    lockKeyAsNumber: String(JSON.parse(`${lockKey}`) as number),
    problemLocs,
    contentType: again.response.headers.get("content-type"),
    listed: page.data.items.map((item) => [item.name, item.lock_key]),
    shownLockKey: shown.data.lock_key,
    nextRuns: shown.data.next_runs.length,
    versions: [shown.data.version, fresh.data.version],
    triggered: [triggered.response.status, triggered.data.args, triggered.data.note],
    argProblemLocs: argProblems.errors.map((problem) => problem.loc.join(".")),
    lateCancel: [late.response.status, late.error?.detail],
    deleted: deleted.response.status,
    afterDelete: gone.response.status,
    headHealthz: probe.status,
  }),
);
