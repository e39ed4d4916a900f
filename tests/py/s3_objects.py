"""Prints every object under s3://BUCKET/PREFIX of the S3 at ENDPOINT as a
JSON object {key: text}, read with boto3 (not courier's code).

usage: s3_objects.py ENDPOINT BUCKET PREFIX
       s3_objects.py --put ENDPOINT BUCKET KEY   (the object's bytes on stdin)
       s3_objects.py --put-many ENDPOINT BUCKET  (stdin: JSON [[key, file], ...])
       s3_objects.py --keys ENDPOINT BUCKET PREFIX   (JSON {key: size}, unread)
"""
import json
import sys

import boto3


def main():
    mode = sys.argv[1] if sys.argv[1].startswith("--") else None
    args = sys.argv[2:] if mode else sys.argv[1:]
    endpoint, bucket = args[:2]
    prefix = args[2] if len(args) > 2 else ""
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="courier-test",
        aws_secret_access_key="courier-test",
    )
    if mode == "--put":
        s3.put_object(Bucket=bucket, Key=prefix, Body=sys.stdin.buffer.read())
        print("{}")
        return
    if mode == "--put-many":
        for key, path in json.load(sys.stdin):
            with open(path, "rb") as f:
                s3.put_object(Bucket=bucket, Key=key, Body=f)
        print("{}")
        return
    if mode == "--keys":
        out = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                out[obj["Key"]] = str(obj["Size"])
        json.dump(out, sys.stdout)
        return
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            try:
                body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            except s3.exceptions.NoSuchKey:
                # Taken (adopted and deleted) between the listing and the read.
                continue
            out[obj["Key"]] = body.decode("utf-8", errors="replace")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
