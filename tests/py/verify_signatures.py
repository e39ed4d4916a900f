"""Verifies courier's deliveries with the reference `standardwebhooks` library.

stdin: {"secrets": ["whsec_..."], "requests": [{"headers": {name: value},
"body_b64": "...", "secrets": [...]?}]}. Each request is verified with each
secret ALONE (a receiver in the middle of a rotation holds only one of
them): the request's own `secrets` when it has them (each endpoint its
own), else the top-level ones.

stdout: {"results": [[{"ok": bool, "error": str|null}, ...per secret], ...per
request]}. Rejections are results, not failures: the caller asserts which
ones it expects (a tampered body must be rejected). Exits non-zero only when
the input itself is unusable.
"""

import base64
import json
import sys

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def verify(secret, headers, body):
    try:
        Webhook(secret).verify(body, headers, json_parse=False)
        return {"ok": True, "error": None}
    except (WebhookVerificationError, UnicodeDecodeError, ValueError) as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def main():
    spec = json.load(sys.stdin)
    results = []
    for req in spec["requests"]:
        body = base64.b64decode(req["body_b64"])
        secrets = req.get("secrets", spec.get("secrets", []))
        results.append([verify(s, req["headers"], body) for s in secrets])
    json.dump({"results": results}, sys.stdout)


if __name__ == "__main__":
    main()
