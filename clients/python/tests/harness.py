"""Real processes for the client's tests: `turnstile dev` (embedded journal, `--data-dir` or `--nats`) and
nats-server with JetStream, each on loopback ports it picked itself (port 0, read back from its ready or
ports file, never chosen here: docs/decisions/0007-bound-addresses.md).

The binaries come from the environment, as `.ci/test-env.sh` and scripts/test set it: TURNSTILE_BIN (the
`turnstile` binary) and NATS_SERVER_BIN. Every wait is bounded by WAIT and fails with the process's log.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import grpc

from turnstile_client import agent_pb2, agent_pb2_grpc, events_pb2

#: The bound of every wait: a wait that expires is a failure, never a timing assertion.
WAIT = 30.0


def _bin(var: str) -> str:
    path = os.environ.get(var)
    if not path or not Path(path).is_file():
        raise RuntimeError(f"{var} is not set to a file: run scripts/setup-test-deps, `source .ci/test-env.sh`, "
                           f"and set TURNSTILE_BIN to target/debug/turnstile (scripts/test does all that)")
    return path


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


class _Process:
    def __init__(self, name: str, args: list[str], scratch: Path):
        self.name = name
        self.log = scratch / f"{name.replace(' ', '-')}.log"
        env = dict(os.environ, NO_COLOR="1")
        env.setdefault("RUST_LOG", "info")
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL)

    def wait_for(self, what: str, probe):
        deadline = time.monotonic() + WAIT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) before {what}:\n{_tail(self.log)}")
            got = probe()
            if got is not None:
                return got
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no {what} within {WAIT} s:\n{_tail(self.log)}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class NatsServer:
    """nats-server with JetStream on a store dir that outlives restarts."""

    def __init__(self, config: str = "") -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="turnstile-py-nats-"))
        (self.scratch / "nats.conf").write_text("max_payload: 8MB\n" + config)
        ports = self.scratch / "ports"
        ports.mkdir()
        args = [_bin("NATS_SERVER_BIN"), "-c", str(self.scratch / "nats.conf"), "-js", "-sd",
                str(self.scratch / "js"), "-a", "127.0.0.1", "-p", "-1", "-m", "-1", "--ports_file_dir", str(ports)]
        self.process = _Process("nats-server", args, self.scratch)

        def read():
            for f in ports.glob(f"*_{self.process.proc.pid}.ports"):
                try:
                    return json.loads(f.read_text())["nats"][0]
                except (ValueError, KeyError, IndexError):
                    return None
            return None

        self.url = self.process.wait_for("ports file", read)

    def close(self) -> None:
        self.process.stop()
        shutil.rmtree(self.scratch, ignore_errors=True)


class DevServer:
    """`turnstile dev` on 127.0.0.1:0; ready once a gRPC call gets an application answer."""

    def __init__(self, *, nats_url: str | None = None, data_dir: Path | None = None, config: str | None = None,
                 extra: list[str] = ()):
        self.scratch = Path(tempfile.mkdtemp(prefix="turnstile-py-dev-"))
        ready = self.scratch / "ready.json"
        args = [_bin("TURNSTILE_BIN"), "dev", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                "--ready-file", str(ready)]
        if nats_url:
            args += ["--nats", nats_url]
        if data_dir:
            args += ["--data-dir", str(data_dir)]
        if config:
            path = self.scratch / "turnstile.toml"
            path.write_text(config)
            args += ["--config", str(path)]
        args += list(extra)
        self.process = _Process("turnstile dev", args, self.scratch)

        def read():
            try:
                r = json.loads(ready.read_text())
            except (OSError, ValueError):
                return None
            return r.get("grpc") if r.get("pid") == self.process.proc.pid else None

        self.address: str = self.process.wait_for("ready file", read)
        self.process.wait_for("gRPC answer", self._answers)

    def _answers(self):
        with grpc.insecure_channel(self.address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            try:
                stub.GetSession(agent_pb2.GetSessionRequest(session=events_pb2.SessionRef(tenant="t", id="probe")),
                                timeout=2)
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return None
            return True

    def log_tail(self) -> str:
        return _tail(self.process.log)

    def stop(self) -> None:
        self.process.stop()

    def kill(self) -> None:
        self.process.kill()

    def close(self) -> None:
        self.process.stop()
        shutil.rmtree(self.scratch, ignore_errors=True)


class Backend:
    """The journal a test runs on: `embedded` (in memory) or `nats` (JetStream on a nats-server of its own)."""

    def __init__(self, name: str):
        self.name = name
        self.nats: NatsServer | None = None
        self.dev: DevServer | None = None

    def start(self, **kwargs) -> DevServer:
        if self.name == "nats":
            self.nats = NatsServer()
            kwargs["nats_url"] = self.nats.url
        self.dev = DevServer(**kwargs)
        return self.dev

    def close(self) -> None:
        if self.dev:
            self.dev.close()
        if self.nats:
            self.nats.close()


async def bounded(awaitable, what: str):
    """`awaitable`, or a failure naming `what` after WAIT."""
    try:
        return await asyncio.wait_for(awaitable, WAIT)
    except asyncio.TimeoutError:
        raise AssertionError(f"timed out after {WAIT} s waiting for {what}") from None
