"""A TCP proxy on loopback that cuts an MCP call's stream once (tests/protocols/test_mcp_resume.py and
test_mcp_cluster.py)."""

import socket
import threading
from urllib.parse import urlparse


class CuttingProxy:
    """Forwards 127.0.0.1:PORT to the first of `urls` (MCP endpoints); the first connection whose answer carries
    a progress event is closed right after forwarding it, and every connection after that goes to the last of
    `urls` (another gateway, on a cluster). Keeps the Last-Event-ID headers clients sent."""

    def __init__(self, urls):
        self.targets = [(urlparse(u).hostname, urlparse(u).port) for u in urls]
        self.listener = socket.create_server(("127.0.0.1", 0))
        first = urlparse(urls[0])
        self.url = urls[0].replace(f":{first.port}", f":{self.listener.getsockname()[1]}")
        self.cut, self.resumes, self.first = threading.Event(), [], []
        threading.Thread(target=self.accept, daemon=True).start()

    def close(self):
        self.listener.close()

    def accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            to_first = not self.cut.is_set()
            server = socket.create_connection(self.targets[0] if to_first else self.targets[-1])
            if to_first:
                self.first.append((client, server))
            threading.Thread(target=self.pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self.pipe, args=(server, client, True), daemon=True).start()

    def pipe(self, source, sink, answers):
        try:
            while data := source.recv(65536):
                if not answers:
                    for line in data.decode("latin-1").split("\r\n"):
                        if line.lower().startswith("last-event-id:"):
                            self.resumes.append(line.split(":", 1)[1].strip())
                sink.sendall(data)
                if answers and b"notifications/progress" in data and not self.cut.is_set():
                    # Every connection to the first target goes, so nothing after the cut can reach it.
                    self.cut.set()
                    for pair in self.first:
                        for s in pair:
                            try:
                                s.shutdown(socket.SHUT_RDWR)
                            except OSError:
                                pass
                    break
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
