"""A stand-in engine for the load guard: a real process that allocates memory step by step, as an
engine loading weights does, and holds it.

    python standin_engine.py PORT STEP_MIB MAX_MIB HEALTHY PROGRESS_FILE

Each step allocates STEP_MIB and touches every page (so the memory is really in use, not just
reserved), then writes the total allocated so far to PROGRESS_FILE. At MAX_MIB it stops
allocating and holds what it has; /health answers 200 from then on when HEALTHY is 1, and 503
forever when it is 0 (a load that never finishes). It logs SGLang-like phase lines."""

import http.server
import os
import sys
import threading
import time

port, step_mib, max_mib, healthy, progress = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                              sys.argv[4] == "1", sys.argv[5])
done = threading.Event()


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if done.is_set() and healthy else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("[stand-in] Load weight begin.", flush=True)
held, total, step = [], 0, step_mib << 20
while total < max_mib << 20:
    block = bytearray(step)
    block[::4096] = b"\x01" * (step // 4096)
    held.append(block)
    total += step
    # whole or not at all: the test reads this file while the guard may kill the process mid-write
    with open(progress + ".tmp", "w") as handle:
        handle.write(str(total))
    os.replace(progress + ".tmp", progress)
    time.sleep(0.05)
print("[stand-in] Load weight end.", flush=True)
if healthy:
    print("The server is fired up and ready to roll!", flush=True)
done.set()
while True:
    time.sleep(1)
