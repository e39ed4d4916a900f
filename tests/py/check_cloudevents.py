"""Independent check of courier's CloudEvents deliveries with the CloudEvents
SDK (cloudevents 2.x), which nobody on this project wrote.

stdin: {"delivered": [REQUEST...], "sent": [REQUEST...]} where REQUEST is
{"headers": {name: value}, "body": "<utf-8 text>"} or with "body_base64".
Every delivered request must be structured mode (one event) or the batch
format (split, each element read with the JSON format); every sent request
is read the same way (or as binary mode, via from_http). The delivered
events must equal the sent ones, matched by (source, id). Exits non-zero
with a message otherwise; prints how many events matched.
"""

import base64
import json
import sys

from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"


def fail(msg):
    print(f"check_cloudevents: {msg}", file=sys.stderr)
    sys.exit(1)


def message(req):
    headers = {k.lower(): v for k, v in req["headers"].items()}
    if "body_base64" in req:
        body = base64.b64decode(req["body_base64"])
    else:
        body = req.get("body", "").encode("utf-8")
    return HTTPMessage(headers=headers, body=body)


def factory(attributes, data):
    """The SDK's CloudEvent, noting whether `time` was given: the SDK
    fills in the current time when it was not, which must not compare."""
    had_time = "time" in attributes
    event = CloudEvent(attributes, data)
    event.courier_had_time = had_time
    return event


def media(msg):
    return msg.headers.get("content-type", "").split(";")[0].strip().lower()


def events(req, delivered):
    msg = message(req)
    if media(msg) == BATCH:
        items = json.loads(msg.body)
        if not isinstance(items, list) or not items:
            fail(f"a batch must be a non-empty JSON array: {msg.body!r}")
        fmt = JSONFormat()
        return [fmt.read(factory, json.dumps(item).encode("utf-8")) for item in items]
    if delivered:
        if media(msg) != STRUCTURED:
            fail(f"delivered content type {msg.headers.get('content-type')!r} is neither {STRUCTURED} nor {BATCH}")
        if any(k.startswith("ce-") for k in msg.headers):
            fail(f"a structured delivery carries ce-* headers: {sorted(msg.headers)}")
    return [from_http(msg, JSONFormat(), factory)]


def comparable(event):
    data = event.get_data()
    # Binary mode gives text for a UTF-8 body; structured mode's data_base64
    # gives bytes: compare the bytes.
    if isinstance(data, str) and not event.get_attributes().get("datacontenttype", "application/json").startswith("text/"):
        data = data.encode("utf-8")
    attributes = dict(event.get_attributes())
    if not event.courier_had_time:
        attributes.pop("time")
    return (attributes, event.courier_had_time, data)


def main():
    given = json.load(sys.stdin)
    sent = {}
    for req in given["sent"]:
        for e in events(req, delivered=False):
            sent[(e.get_source(), e.get_id())] = e
    got = {}
    for req in given["delivered"]:
        for e in events(req, delivered=True):
            key = (e.get_source(), e.get_id())
            if key in got:
                fail(f"event {key} delivered twice")
            got[key] = e
    if sorted(got) != sorted(sent):
        fail(f"delivered events {sorted(got)} != sent {sorted(sent)}")
    for key, e in sent.items():
        want, have = comparable(e), comparable(got[key])
        if want != have:
            fail(f"event {key}: delivered {have!r} != sent {want!r}")
    print(f"ok: {len(got)} events")


main()
