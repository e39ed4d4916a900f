"""Azure Blob (Azurite) for the tests, with Azure's own SDK.

usage: az_blobs.py create ENDPOINT CONTAINER
       az_blobs.py list ENDPOINT CONTAINER PREFIX   -> JSON {name: text}
ENDPOINT is the blob endpoint of the account devstoreaccount1, e.g.
http://127.0.0.1:10000/devstoreaccount1
"""
import json
import sys

from azure.storage.blob import BlobServiceClient

# Azurite's well-known development account.
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def main():
    cmd, endpoint, container = sys.argv[1:4]
    conn = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        f"AccountKey={KEY};BlobEndpoint={endpoint};"
    )
    service = BlobServiceClient.from_connection_string(conn)
    client = service.get_container_client(container)
    if cmd == "create":
        client.create_container()
        print("{}")
    elif cmd == "list":
        prefix = sys.argv[4]
        out = {}
        for blob in client.list_blobs(name_starts_with=prefix):
            body = client.download_blob(blob.name).readall()
            out[blob.name] = body.decode("utf-8", errors="replace")
        json.dump(out, sys.stdout)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
