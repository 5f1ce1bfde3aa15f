#!/usr/bin/env python3
"""Faults for tests/e2e/49-controller-write-faults, through the API server's own admission.

  faults.py webhook PORT CERT KEY STATS     a validating webhook for ResourceClaim updates
                                            (spec and status): each waits 0-250 ms, one in
                                            ten is refused as a conflict (409), one in twenty
                                            as an internal error (500), one in twenty as
                                            unavailable (503); STATS gets the counts and the
                                            most requests in flight at once (not counting
                                            the poker's), as JSON
  faults.py poke NS STOPFILE                merge-patches an annotation of a random claim of
                                            NS every 20 ms until STOPFILE exists (a writer
                                            beside the controller: its conditional writes
                                            then meet newer versions)
"""
import json
import os
import random
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "hack"))
import replay  # noqa: E402  (the harness's API client)

POKER = "e2e-49-poke"


def webhook(port, cert, key, stats_path):
    lock = threading.Lock()
    stats = {"requests": 0, "conflicts": 0, "internal": 0, "unavailable": 0, "allowed": 0, "in_flight": 0, "max_in_flight": 0}
    rnd = random.Random(49)

    def save():
        with open(stats_path + ".tmp", "w") as f:
            json.dump(stats, f)
        os.replace(stats_path + ".tmp", stats_path)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            uid = review["request"]["uid"]
            # The second writer's patches carry its field manager; in flight counts the others.
            ours = (review["request"].get("options") or {}).get("fieldManager") != POKER
            with lock:
                stats["requests"] += 1
                stats["in_flight"] += ours
                stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
                draw, wait = rnd.random(), rnd.uniform(0, 0.25)
            time.sleep(wait)
            if draw < 0.1:
                kind, resp = "conflicts", {"allowed": False, "status": {"code": 409, "reason": "Conflict", "message": "e2e 49: injected conflict"}}
            elif draw < 0.15:
                kind, resp = "internal", {"allowed": False, "status": {"code": 500, "reason": "InternalError", "message": "e2e 49: injected failure"}}
            elif draw < 0.2:
                kind, resp = "unavailable", {"allowed": False, "status": {"code": 503, "reason": "ServiceUnavailable", "message": "e2e 49: injected failure"}}
            else:
                kind, resp = "allowed", {"allowed": True}
            resp["uid"] = uid
            body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            with lock:
                stats["in_flight"] -= ours
                stats[kind] += 1
                save()

    srv = ThreadingHTTPServer(("127.0.0.1", int(port)), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    save()
    srv.serve_forever()


def poke(ns, stop):
    n = 0
    while not os.path.exists(stop):
        claims = replay.list_all(f"{replay.RES}/namespaces/{ns}/resourceclaims")
        for c in random.sample(claims, min(len(claims), 25)):
            if os.path.exists(stop):
                break
            # Refusals by the webhook are expected: ignore them.
            try:
                replay.call("PATCH", f"{replay.RES}/namespaces/{ns}/resourceclaims/{c['metadata']['name']}?fieldManager={POKER}",
                            {"metadata": {"annotations": {"e2e.fgpu.dev/poke": str(n)}}},
                            ctype="application/merge-patch+json", ok=(200, 404, 409, 500, 503))
            except SystemExit:
                pass
            n += 1
            time.sleep(0.02)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "webhook":
        webhook(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "poke":
        poke(*sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
