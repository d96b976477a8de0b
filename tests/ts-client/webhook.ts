// What a TypeScript webhook target does with a signed delivery from Tickgate: verify it
// with the npm `standardwebhooks` package (tests/acceptance/test_ts_webhook.py).
// Reads {"secrets": [...], "body": "...", "headers": {...}} on stdin and prints, per
// secret, whether the delivery verified with it.
import { Webhook } from "standardwebhooks";

interface Delivery {
  secrets: string[];
  body: string;
  headers: Record<string, string>;
}

function verifies(secret: string, delivery: Delivery): boolean {
  try {
    new Webhook(secret).verify(delivery.body, delivery.headers);
    return true;
  } catch {
    return false;
  }
}

const chunks: Buffer[] = [];
for await (const chunk of process.stdin) {
  chunks.push(chunk as Buffer);
}
const delivery = JSON.parse(Buffer.concat(chunks).toString("utf8")) as Delivery;
console.log(JSON.stringify(delivery.secrets.map((secret) => verifies(secret, delivery))));
