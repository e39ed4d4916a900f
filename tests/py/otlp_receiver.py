"""A real OTLP/HTTP trace receiver for the tests: decodes each export with
the OpenTelemetry project's own protobuf classes (`opentelemetry-proto`),
never with courier's code, and appends every span as one JSON line to the
file named by the first argument:

    {"trace_id", "span_id", "parent_span_id" (hex, "" for a root), "name",
     "kind", "attributes": {key: value}, "links": [{"trace_id", "span_id",
     "attributes"}], "status": {"code", "message"}, "service": name}

It listens on a free loopback port (port 0) and prints that port as its
first line on stdout. It answers 200 with an empty
ExportTraceServiceResponse, as a collector does.
"""

import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OUT = sys.argv[1]
LOCK = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces" or "protobuf" not in self.headers.get("content-type", ""):
            self.answer(404, b"")
            return
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        lines = []
        for rs in req.resource_spans:
            service = attributes(rs.resource.attributes).get("service.name")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    lines.append(json.dumps({
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "kind": s.kind,
                        "attributes": attributes(s.attributes),
                        "links": [{
                            "trace_id": l.trace_id.hex(),
                            "span_id": l.span_id.hex(),
                            "attributes": attributes(l.attributes),
                        } for l in s.links],
                        "status": {"code": s.status.code, "message": s.status.message},
                        "service": service,
                    }))
        with LOCK, open(OUT, "a", encoding="utf-8") as f:
            for line in lines:
                f.write(line + "\n")
        self.answer(200, ExportTraceServiceResponse().SerializeToString())

    def answer(self, status, body):
        self.send_response(status)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
