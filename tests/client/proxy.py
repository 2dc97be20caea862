"""A TCP proxy that drops its first connection after a number of response bytes.

Used to test what a user meets on a flaky network: the client must reconnect and resume
(``Last-Event-ID`` for event streams) without losing or repeating anything.
"""

from __future__ import annotations

import socket
import threading

__all__ = ["DroppingProxy"]


class DroppingProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``; connection number 1 is closed after
    ``cut_after`` bytes from the server. ``connections`` counts accepted connections."""

    def __init__(self, target: tuple[str, int], cut_after: int) -> None:
        self.target, self.cut_after, self.connections = target, cut_after, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            limit = self.cut_after if self.connections == 1 else None
            upstream = socket.create_connection(self.target)
            for args in ((downstream, upstream, None), (upstream, downstream, limit)):
                t = threading.Thread(
                    target=self._pipe, args=(*args, (downstream, upstream)), daemon=True
                )
                t.start()
                self._threads.append(t)

    @staticmethod
    def _pipe(
        src: socket.socket,
        dst: socket.socket,
        limit: int | None,
        both: tuple[socket.socket, socket.socket],
    ) -> None:
        sent = 0
        try:
            while data := src.recv(65536):
                if limit is not None and sent + len(data) >= limit:
                    dst.sendall(data[: limit - sent])
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in both:  # one side ended (or was cut): close the whole connection
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.listener.close()
