"""Publishes to courier with azure-eventgrid's EventGridPublisherClient, as
an app that today publishes to Event Grid does, unchanged but for the
endpoint. Nobody on this project wrote the client: if courier's answer is
not what Event Grid answers, `send` raises and this exits non-zero.

usage: publish_azure.py ENDPOINT KEY CREDENTIAL KIND ID...
  CREDENTIAL: key (AzureKeyCredential, sent as aeg-sas-key) or
              sas (AzureSasCredential from generate_sas, aeg-sas-token)
  KIND: eventgrid (EventGridEvent), cloudevent (CloudEvent), or
        eventgrid-no-data (EventGridEvent(data=None): the SDK leaves `data`
        out) and eventgrid-no-version (data_version=None: it leaves
        `dataVersion` out), the fields Event Grid's schema makes optional
Prints one line, `sent N`.
"""

import sys
from datetime import datetime, timedelta, timezone

from azure.core.credentials import AzureKeyCredential, AzureSasCredential
from azure.core.messaging import CloudEvent
from azure.eventgrid import EventGridEvent, EventGridPublisherClient, generate_sas


def main():
    endpoint, key, credential, kind, *ids = sys.argv[1:]
    if credential == "key":
        cred = AzureKeyCredential(key)
    elif credential == "sas":
        expiry = datetime.now(timezone.utc) + timedelta(hours=1)
        cred = AzureSasCredential(generate_sas(endpoint, key, expiry))
    else:
        sys.exit(f"unknown credential {credential!r}")
    if kind.startswith("eventgrid"):
        data = lambda i: None if kind == "eventgrid-no-data" else {"order": i}
        version = None if kind == "eventgrid-no-version" else "1.0"
        if kind not in ("eventgrid", "eventgrid-no-data", "eventgrid-no-version"):
            sys.exit(f"unknown kind {kind!r}")
        events = [
            EventGridEvent(
                subject=f"/orders/{i}",
                event_type="Shop.OrderCreated",
                data=data(i),
                data_version=version,
                id=i,
            )
            for i in ids
        ]
    elif kind == "cloudevent":
        events = [
            CloudEvent(source="/shop", type="shop.order.created", data={"order": i}, id=i)
            for i in ids
        ]
    else:
        sys.exit(f"unknown kind {kind!r}")
    client = EventGridPublisherClient(endpoint, cred)
    client.send(events)
    print(f"sent {len(events)}")


main()
