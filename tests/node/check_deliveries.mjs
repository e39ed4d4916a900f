// Reads courier's deliveries with @azure/eventgrid's EventGridDeserializer,
// the code an Event Grid receiver in Node runs; nobody on this project
// wrote it. It refuses an Event Grid event without `topic` or
// `metadataVersion: "1"`, as Event Grid never delivers one.
//
// usage: node check_deliveries.mjs eventgrid|cloudevents < INPUT
// INPUT: {"deliveries": [{"headers": {...}, "body": "<text>"}, ...]}
// Prints `ok: N events` and then the events as the SDK read them, one JSON
// line each; exits non-zero, naming the delivery, when one is refused.

import { EventGridDeserializer } from "@azure/eventgrid";

const schema = process.argv[2];
const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const { deliveries } = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const consumer = new EventGridDeserializer();
const read = [];
for (const [i, delivery] of deliveries.entries()) {
  try {
    const events =
      schema === "eventgrid"
        ? await consumer.deserializeEventGridEvents(delivery.body)
        : await consumer.deserializeCloudEvents(delivery.body);
    read.push(...events);
  } catch (e) {
    console.error(`check_deliveries: delivery ${i} refused by EventGridDeserializer: ${e.message}: ${delivery.body}`);
    process.exit(1);
  }
}
console.log(`ok: ${read.length} events`);
for (const e of read) console.log(JSON.stringify(e));
