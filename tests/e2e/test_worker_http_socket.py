"""A worker's HTTP listener is opened by the supervisor and handed down by descriptor.

CI once failed on "Address already in use": the supervisor picked a free port, closed
it, and the worker bound it later; another process took it in between, and a worker
that cannot start stops the whole proxy. Now the port is held from the start."""

from __future__ import annotations

import socket

from kproxy.runtime.listeners import inherited_listener
from kproxy.supervisor.workers import HTTP_FD_FLAG, Supervisor, Worker, worker_http_socket


def test_the_port_is_held_before_any_worker_runs() -> None:
    sock = worker_http_socket()
    try:
        port = sock.getsockname()[1]
        assert sock.getsockname()[0] == "127.0.0.1" and port > 0
        other = socket.socket()
        try:  # nobody else can bind it while the supervisor holds it
            try:
                other.bind(("127.0.0.1", port))
                raise AssertionError("another socket bound the worker's HTTP port")
            except OSError:
                pass
        finally:
            other.close()
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        client.close()  # queued in the backlog until a worker accepts
        listener = inherited_listener(sock.fileno())
        assert listener.socket.getsockname()[1] == port
    finally:
        sock.close()


def test_the_worker_command_names_the_descriptor() -> None:
    sup = Supervisor.__new__(Supervisor)  # command() reads only the run arguments
    sup.run_argv = ["--upstream", "127.0.0.1:9092"]
    worker = Worker(0, worker_http_socket())
    try:
        cmd = sup.command(worker)
        at = cmd.index(HTTP_FD_FLAG)
        assert cmd[at + 1] == str(worker.http.fileno())
        assert f"127.0.0.1:{worker.http_port}" in cmd
    finally:
        worker.http.close()
