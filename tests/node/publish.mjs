// Publishes to courier with @azure/eventgrid's EventGridPublisherClient, as
// a Node app that today publishes to Event Grid does: unchanged but for the
// endpoint and `allowInsecureConnection: true`, which the SDK needs for
// courier's http:// listener. Nobody on this project wrote the client: if
// courier's answer is not what Event Grid answers, `send` throws and this
// exits non-zero.
//
// usage: node publish.mjs ENDPOINT KEY KIND OPTIONS ID...
//   KIND: eventgrid (EventGridEvent) or cloudevent (CloudEvent)
//   OPTIONS: insecure ({ allowInsecureConnection: true }) or defaults ({})
// Prints one line, `sent N`.

import { AzureKeyCredential, EventGridPublisherClient } from "@azure/eventgrid";

const [endpoint, key, kind, options, ...ids] = process.argv.slice(2);
const schemas = { eventgrid: "EventGrid", cloudevent: "CloudEvent" };
if (!(kind in schemas)) throw new Error(`unknown kind ${kind}`);
const clientOptions = { insecure: { allowInsecureConnection: true }, defaults: {} }[options];
if (!clientOptions) throw new Error(`unknown options ${options}`);

const events = ids.map((id) =>
  kind === "eventgrid"
    ? {
        id,
        subject: `/orders/${id}`,
        eventType: "Shop.OrderCreated",
        dataVersion: "1.0",
        data: { order: id },
      }
    : { id, source: "/shop", type: "shop.order.created", data: { order: id } },
);
const client = new EventGridPublisherClient(
  endpoint,
  schemas[kind],
  new AzureKeyCredential(key),
  clientOptions,
);
await client.send(events);
console.log(`sent ${events.length}`);
