"""A real TCP proxy in front of a gateway, for faults a client must survive.

It can hang up on the first connections (as a restarting gateway or a flaky
network does), cut the open ones, and records what clients sent, so tests can
see headers on the wire. Bytes are relayed untouched: the gateway behind it is the real one.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit


class TCPProxy:
    def __init__(self, target_url: str, drop_first: int = 0) -> None:
        target = urlsplit(target_url)
        self.target = (target.hostname or "127.0.0.1", target.port or 80)
        self.drop = drop_first
        self.connections = 0
        self.received = bytearray()  # what clients sent, all connections
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._closed = False
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> TCPProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self._server.close()

    def cut(self, refuse_next: int = 0) -> None:
        """Break every open connection (and hang up on the next ``refuse_next`` ones)."""
        with self._lock:
            self.drop += refuse_next
            victims, self._open = self._open, []
        for sock in victims:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                drop, self.drop = self.drop > 0, max(self.drop - 1, 0)
            if drop:
                # Read the request first so the client sees a hang-up, not a refused send.
                with contextlib.suppress(OSError):
                    conn.settimeout(2)
                    self._record(conn.recv(65536))
                conn.close()
                continue
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _record(self, data: bytes) -> None:
        with self._lock:
            self.received += data

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.target)
        with self._lock:
            self._open += [client, upstream]

        def pump(src: socket.socket, dst: socket.socket, record: bool) -> None:
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    if record:
                        self._record(data)
                    dst.sendall(data)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

        back = threading.Thread(target=pump, args=(upstream, client, False), daemon=True)
        back.start()
        pump(client, upstream, True)
        back.join()
        client.close()
        upstream.close()
