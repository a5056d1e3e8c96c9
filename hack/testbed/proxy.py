"""A loopback TCP relay that can be cut and restored: a real network outage for a client (connections refused
while down, open connections reset), or a hang (connections accepted, nothing answered), in front of a real
server."""

from __future__ import annotations

import contextlib
import socket
import threading

from . import free_port


class TcpRelay:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._hung = threading.Event()

    def up(self) -> TcpRelay:
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(64)
        self._listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()
        return self

    @property
    def is_up(self) -> bool:
        return self._listener is not None

    def down(self) -> None:
        """Refuses new connections and cuts the open ones."""
        ls, self._listener = self._listener, None
        if ls is not None:
            with contextlib.suppress(OSError):
                ls.shutdown(socket.SHUT_RDWR)  # wakes the accept(); close() alone leaves it listening
            ls.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:  # shutdown() wakes the relay's threads blocked in recv(); close() alone would not
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def hang(self) -> None:
        """Connections stay open and new ones are accepted, but nothing reaches the server: a peer that
        stopped answering without a reset, which only a client's own timeout notices."""
        self._hung.set()

    def resume(self) -> None:
        self._hung.clear()

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                client, _ = ls.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not self._hung.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
