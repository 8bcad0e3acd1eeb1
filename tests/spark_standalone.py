"""A Spark standalone cluster on loopback, from the installed pyspark: one master and
some workers, each its own JVM started with ``spark-class`` (what ``sbin/start-*.sh``
run), for the cluster test and ``make bench-pipeline``.

Each worker offers ``cores`` cores and ``memory`` (``--cores``/``--memory``, and
``SPARK_WORKER_CORES``/``SPARK_WORKER_MEMORY`` in its environment, which say the same),
so a cluster of two 1-core workers and one of a 2-core worker can be compared on one
machine. An application takes every core a worker offers unless told otherwise
(``spark.executor.cores``, ``spark.cores.max``).

Readiness is read, not waited for: the master's log names its URLs, and its JSON page
lists the workers that registered, with their cores and memory. Every wait is bounded;
``stop`` ends exactly the processes started here.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
UI_URL = re.compile(r"MasterWebUI.*started at (http://\S+)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def spark_env(workdir: Path) -> dict[str, str]:
    """Everything on loopback, and the logs in ``workdir``: also for the driver."""
    env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=str(workdir / "logs"), SPARK_NO_DAEMONIZE="1")
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    return env


class Standalone:
    """``with Standalone(tmp, workers=2, cores=1) as cluster: ... cluster.url``"""

    def __init__(self, workdir: Path, workers: int = 1, cores: int = 1,
                 memory: str = "1g", timeout: float = 90.0) -> None:
        self.workdir, self.workers, self.cores, self.memory = workdir, workers, cores, memory
        self.timeout = timeout
        self.procs: list[subprocess.Popen[bytes]] = []
        self.url = ""
        self.ui = ""

    def _start(self, name: str, args: list[str], **env: str) -> Path:
        log = self.workdir / f"{name}.log"
        with open(log, "wb") as out:
            self.procs.append(subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-class"), *args], stdout=out,
                stderr=subprocess.STDOUT, env=dict(spark_env(self.workdir), **env),
                cwd=self.workdir))
        return log

    def _wait(self, what: str, check: Callable[[], object]) -> str:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a Spark process exited ({p.returncode}) before "
                                       f"{what}; see {self.workdir}/*.log")
            found = check()
            if found:
                return str(found)
            time.sleep(0.2)
        raise TimeoutError(f"no {what} within {self.timeout} s; see {self.workdir}/*.log")

    def start(self) -> Standalone:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self._start("master", ["org.apache.spark.deploy.master.Master",
                                     "--host", "127.0.0.1", "--port", str(_free_port()),
                                     "--webui-port", str(_free_port())])

        def urls() -> str | None:
            text = log.read_text(errors="replace")
            master, ui = MASTER_URL.search(text), UI_URL.search(text)
            return f"{master.group(1)} {ui.group(1)}" if master and ui else None

        self.url, self.ui = self._wait("master URLs in its log", urls).split()
        for i in range(self.workers):
            work = self.workdir / f"worker-{i}"
            work.mkdir(exist_ok=True)
            self._start(f"worker-{i}", [
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--port", str(_free_port()), "--webui-port", str(_free_port()),
                "--cores", str(self.cores), "--memory", self.memory,
                "--work-dir", str(work), self.url],
                SPARK_WORKER_CORES=str(self.cores), SPARK_WORKER_MEMORY=self.memory)
        want = [self.cores] * self.workers
        self._wait(f"{self.workers} alive workers of {self.cores} cores each",
                   lambda: sorted(cores for cores, _ in self.registered()) == want)
        return self

    def status(self) -> dict[str, object]:
        """The master's JSON page (``/json/``); empty while it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.ui}/json/", timeout=5) as resp:
                data = json.load(resp)
                return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def registered(self) -> list[tuple[int, int]]:
        """(cores, memory in MiB) of each alive worker, as the master lists them."""
        workers = self.status().get("workers")
        return [(int(w["cores"]), int(w["memory"])) for w in
                (workers if isinstance(workers, list) else [])
                if isinstance(w, dict) and w.get("state") == "ALIVE"]

    def alive(self) -> int:
        return len(self.registered())

    def stop(self) -> None:
        """Workers first, then the master: SIGTERM, then SIGKILL after 20 s."""
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        self.procs.clear()

    def __enter__(self) -> Standalone:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
