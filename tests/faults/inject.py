"""The faults the suite and the bench inject: a broker that goes away, a database that drops
its connections (a worker's SIGKILL is :meth:`tests.workers.WorkerProcess.kill`).

:class:`Relay` is a TCP relay in front of the broker: workers and producers connect to its port
instead of RabbitMQ's. :meth:`Relay.down` drops every relayed connection and refuses new ones,
as a stopped or unreachable broker would, while RabbitMQ itself (shared with other runs) keeps
running; :meth:`Relay.up` listens again on the same port.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit, urlunsplit

import psycopg
from django.db import connection

CHUNK = 65536


class Relay:
    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 5672)
        self._parts = parts
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = int(probe.getsockname()[1])
        probe.close()
        self.up()

    @property
    def url(self) -> str:
        """The broker URL, through the relay."""
        auth = self._parts.netloc.rsplit("@", 1)[0] + "@" if "@" in self._parts.netloc else ""
        return urlunsplit(self._parts._replace(netloc=f"{auth}127.0.0.1:{self.port}"))

    @property
    def is_up(self) -> bool:
        return self._listener is not None

    def up(self) -> None:
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True,
                         name="relay-accept").start()  # fmt: skip

    def down(self) -> None:
        """Refuse new connections and cut every open one (both directions, at once)."""
        with self._lock:
            listener, self._listener = self._listener, None
            open_sockets, self._sockets = self._sockets, set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in open_sockets:  # each relayed socket's reader closes it (see _pump)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the relay went down
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # went down meanwhile
                    client.close()
                    server.close()
                    return
                self._sockets.update((client, server))
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True,
                                 name="relay-pump").start()  # fmt: skip

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(CHUNK):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):  # the other direction's reader wakes up and ends too
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._sockets.discard(src)
            src.close()


def terminate_other_backends() -> int:
    """Terminate every session on this process's database but its own (a failover, a server
    restart); the number terminated."""
    params = connection.get_connection_params()
    kept = {k: params[k] for k in ("dbname", "user", "host", "port", "password") if params.get(k)}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        own = int(cursor.fetchone()[0])
    with psycopg.connect(**kept, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
            "AND pid <> pg_backend_pid() AND pid <> %s",
            [connection.settings_dict["NAME"], own],
        ).fetchall()
    return len(rows)
