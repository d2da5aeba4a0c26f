"""A TCP proxy: ``python tcp_proxy.py PORT HOST:PORT [--lose-first-answer]`` forwards every
connection to the target. Killing it is a service going away mid-request; starting it again, the
service coming back. With ``--lose-first-answer`` the first connection's request reaches the target
and is applied, but its answer is dropped and the connection closed: a reply lost on the way back."""

import contextlib
import socket
import sys
import threading


def pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


class Answers:
    """The target's side of each connection, forwarded; the first answer dropped when asked (a
    connection that never carries an answer, such as a probe of the port, does not count)."""

    def __init__(self, lose_first: bool) -> None:
        self.lose, self.lock = lose_first, threading.Lock()

    def forward(self, upstream: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            first = upstream.recv(65536)
            while first.startswith(b"HTTP/1.1 100 ") and first.endswith(b"\r\n\r\n"):
                client.sendall(first)  # "100 Continue": the request's body is still to come
                first = upstream.recv(65536)
            with self.lock:
                lost, self.lose = self.lose and bool(first), self.lose and not first
            if lost:  # the request was whole and applied; its answer never arrives
                print(f"lost an answer of {len(first)} bytes: {first.splitlines()[0]!r}", flush=True)
                for s in (upstream, client):
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                return
            if first:
                client.sendall(first)
        pipe(upstream, client)


def main() -> None:
    port, target = int(sys.argv[1]), sys.argv[2].removeprefix("http://")
    answers = Answers(lose_first="--lose-first-answer" in sys.argv[3:])
    host, target_port = target.rsplit(":", 1)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(128)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection((host, int(target_port)))
        except OSError:
            client.close()
            continue
        threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=answers.forward, args=(upstream, client), daemon=True).start()


if __name__ == "__main__":
    main()
