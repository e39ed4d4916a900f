"""Prints every object under s3://BUCKET/PREFIX of the S3 at ENDPOINT as a
JSON object {key: text}, read with boto3 (not courier's code).

usage: s3_objects.py ENDPOINT BUCKET PREFIX
       s3_objects.py --put ENDPOINT BUCKET KEY   (the object's bytes on stdin)
"""
import json
import sys

import boto3


def main():
    put = sys.argv[1] == "--put"
    endpoint, bucket, prefix = sys.argv[2:5] if put else sys.argv[1:4]
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="courier-test",
        aws_secret_access_key="courier-test",
    )
    if put:
        s3.put_object(Bucket=bucket, Key=prefix, Body=sys.stdin.buffer.read())
        print("{}")
        return
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            out[obj["Key"]] = body.decode("utf-8", errors="replace")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
