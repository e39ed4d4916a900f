"""Independent check of courier's Event Grid deliveries and dead letters
with azure-eventgrid's EventGridEvent, which nobody on this project wrote.

stdin: {"deliveries": [REQUEST...], "dead_letters": [RECORD...],
"sent": [EVENT...], "topic": TOPIC} where REQUEST is {"headers": {...},
"body": "<text>"}. Each delivery must be `application/json` holding a JSON
array; every element, and every dead-letter record, must be accepted by
EventGridEvent.from_dict and, as its own JSON text, by
EventGridEvent.from_json (the consumer-side parsers), must carry every field
its `_validation` map marks required (from_dict itself is permissive), and
must carry the `topic` and `metadataVersion: "1"` Event Grid fills on
delivery. When "sent" is given, the delivered events must equal the sent
ones, given "topic" (the route's Event Grid topic) and metadataVersion "1"
where the publisher left them out. Exits non-zero with a message otherwise.
"""

import json
import sys

from azure.eventgrid import EventGridEvent


def fail(msg):
    print(f"check_eventgrid: {msg}", file=sys.stderr)
    sys.exit(1)


REQUIRED = [
    EventGridEvent._attribute_map[attr]["key"]
    for attr, rule in EventGridEvent._validation.items()
    if rule.get("required")
]
# Optional to publish, always there on delivery (Event Grid fills them).
DELIVERED = ["topic", "metadataVersion"]


def check(event, what):
    if not isinstance(event, dict):
        fail(f"{what}: not a JSON object: {event!r}")
    missing = [key for key in REQUIRED + DELIVERED if key not in event]
    if missing:
        fail(f"{what}: missing required fields {missing} (required: {REQUIRED + DELIVERED}): {event!r}")
    for how, parse in [("from_dict", EventGridEvent.from_dict), ("from_json", lambda e: EventGridEvent.from_json(json.dumps(e)))]:
        try:
            parsed = parse(event)
        except Exception as e:  # the SDK's own refusal, whatever its type
            fail(f"{what}: EventGridEvent.{how} refused it: {e!r}: {event!r}")
        if parsed.id != event["id"] or parsed.event_type != event["eventType"] or parsed.subject != event["subject"]:
            fail(f"{what}: {how} read {parsed!r} from {event!r}")
        if parsed.event_time is None:
            fail(f"{what}: {how} could not read eventTime {event['eventTime']!r}")
        if not isinstance(parsed.topic, str) or parsed.topic != event["topic"] or parsed.metadata_version != "1":
            fail(f"{what}: {how} read topic {parsed.topic!r}, metadataVersion {parsed.metadata_version!r} from {event!r}")
    return event


def main():
    given = json.load(sys.stdin)
    delivered = []
    for i, req in enumerate(given.get("deliveries", [])):
        headers = {k.lower(): v for k, v in req["headers"].items()}
        ct = headers.get("content-type", "").split(";")[0].strip().lower()
        if ct != "application/json":
            fail(f"delivery {i}: content type {headers.get('content-type')!r}, want application/json")
        body = json.loads(req["body"])
        if not isinstance(body, list) or not body:
            fail(f"delivery {i}: not a non-empty JSON array: {req['body']!r}")
        for j, event in enumerate(body):
            delivered.append(check(event, f"delivery {i} event {j}"))
    for i, record in enumerate(given.get("dead_letters", [])):
        check(record, f"dead letter {i}")
    if "sent" in given:
        by_id = lambda events: sorted(events, key=lambda e: e["id"])
        want = [{"topic": given["topic"], "metadataVersion": "1", **e} for e in given["sent"]]
        if by_id(delivered) != by_id(want):
            fail(f"delivered {by_id(delivered)!r} != sent {by_id(want)!r}")
    print(f"ok: {len(delivered)} events, {len(given.get('dead_letters', []))} dead letters; required {REQUIRED}")


main()
