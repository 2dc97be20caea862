"""A TCP proxy that can be switched off and on: a database that becomes unreachable.

``stop`` closes the listening socket and every open connection (as a network partition or a
stopped server would: new connections are refused, open ones end); ``start`` listens again on
the same port.
"""

from __future__ import annotations

import socket
import threading

__all__ = ["SwitchableProxy"]


class SwitchableProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target`` while on."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener: socket.socket | None = None
        self.port = 0
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.start()

    def start(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))  # SO_REUSEADDR
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def stop(self) -> None:
        if self.listener is not None:
            try:  # wakes the thread blocked in accept(); close() alone would not
                self.listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.listener.close()
            self.listener = None
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                down, _ = listener.accept()
            except OSError:  # closed by stop()
                return
            try:
                up = socket.create_connection(self.target)
            except OSError:
                down.close()
                continue
            with self._lock:
                self._conns.update((down, up))
            for src, dst in ((down, up), (up, down)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        with self._lock:
            self._conns.discard(src)
            self._conns.discard(dst)
