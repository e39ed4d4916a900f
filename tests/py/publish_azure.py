"""Publishes to courier with azure-eventgrid's EventGridPublisherClient, as
an app that today publishes to Event Grid does, unchanged but for the
endpoint. Nobody on this project wrote the client: if courier's answer is
not what Event Grid answers, `send` raises and this exits non-zero.

usage: publish_azure.py ENDPOINT KEY CREDENTIAL KIND ID...
  CREDENTIAL: key (AzureKeyCredential, sent as aeg-sas-key) or
              sas (AzureSasCredential from generate_sas, aeg-sas-token)
  KIND: eventgrid (EventGridEvent) or cloudevent (CloudEvent)
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
    if kind == "eventgrid":
        events = [
            EventGridEvent(
                subject=f"/orders/{i}",
                event_type="Shop.OrderCreated",
                data={"order": i},
                data_version="1.0",
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
