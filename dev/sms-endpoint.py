#!/usr/bin/env python3
"""A stand-in downstream for the README's seed-003 walkthrough: the "SMS service".

Listens on 127.0.0.1:PORT (default 9000), prints each request's method, path
and JSON body (one line), and answers HTTP 200 with {"code": 0}: what
orderpipe's deliveries count as a success. Stop it with Ctrl-C.

    python3 dev/sms-endpoint.py [PORT]
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        try:
            shown = json.dumps(json.loads(body), ensure_ascii=False)
        except ValueError:
            shown = body.decode("utf-8", "replace")
        print(f"{self.command} {self.path} {shown}", flush=True)
        answer = b'{"code": 0, "message": "sent"}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_PUT = do_POST

    def log_message(self, *args):
        pass  # one line per request is printed above


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
    print(f"SMS service listening on http://127.0.0.1:{port}", flush=True)
    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
