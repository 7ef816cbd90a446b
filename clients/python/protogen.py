"""Generates turnstile_client's protobuf and gRPC modules from Turnstile's .proto files (grpcio-tools).

Run by the package build (setup.py) and by the tests; safe to run again and from several processes at once
(a lock file serialises them, and a run whose inputs have not changed writes nothing). The generated code
lands in src/turnstile_client/_proto/, which is not checked in: the protos in proto/proto are the only source.

    python protogen.py [--protos DIR]

The protos are read from DIR, else from ./proto (an sdist carries a copy there), else from the repository's
proto/proto. Only the public packages are generated (turnstile.v1, turnstile.hooks.v1); the internal
turnstile.cluster.v1 is not part of the client. grpc_tools writes absolute imports (`from turnstile.v1
import events_pb2`); they are rewritten to the package (`from turnstile_client._proto.turnstile.v1 ...`), so
the client installs no top-level `turnstile` package of its own.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "src" / "turnstile_client" / "_proto"
PACKAGES = ("turnstile/v1", "turnstile/hooks/v1")
PREFIX = "turnstile_client._proto."
# `from turnstile.v1 import x_pb2 as y` and `import turnstile.v1.x_pb2` in generated .py and .pyi files.
IMPORT = re.compile(r"^(from|import) (turnstile\.)", re.MULTILINE)


def proto_root(explicit: str | None) -> Path:
    candidates = [Path(explicit)] if explicit else [HERE / "proto", HERE.parent.parent / "proto" / "proto"]
    for root in candidates:
        if (root / "turnstile" / "v1" / "agent.proto").is_file():
            return root
    tried = ", ".join(str(c) for c in candidates)
    raise SystemExit(f"protogen: no turnstile/v1/agent.proto under {tried}; pass --protos DIR")


def proto_files(root: Path) -> list[str]:
    files = []
    for package in PACKAGES:
        files += sorted(f"{package}/{p.name}" for p in (root / package).glob("*.proto"))
    return files


def fingerprint(root: Path, files: list[str]) -> str:
    from importlib.metadata import version

    digest = hashlib.sha256(f"grpcio-tools {version('grpcio-tools')}\n".encode())
    for f in files:
        digest.update(f.encode() + b"\0" + (root / f).read_bytes() + b"\0")
    return digest.hexdigest()


def generate(root: Path, out: Path = OUT) -> bool:
    """Generates into `out` unless it already holds the code of these protos; True if it wrote."""
    from grpc_tools import protoc

    files = proto_files(root)
    stamp = fingerprint(root, files)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".protogen.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp_file = out / ".stamp"
        if stamp_file.is_file() and stamp_file.read_text() == stamp:
            return False
        staging = Path(tempfile.mkdtemp(prefix="_proto.", dir=out.parent))
        try:
            args = ["grpc_tools.protoc", f"-I{root}", f"--python_out={staging}", f"--pyi_out={staging}"]
            args += [f"--grpc_python_out={staging}", *files]
            if protoc.main(args) != 0:
                raise SystemExit(f"protogen: grpc_tools.protoc failed on {root}")
            for path in staging.rglob("*.py*"):
                path.write_text(IMPORT.sub(lambda m: f"{m.group(1)} {PREFIX}{m.group(2)}", path.read_text()))
            for directory in [staging, *(p for p in staging.rglob("*") if p.is_dir())]:
                (directory / "__init__.py").touch()
            (staging / ".stamp").write_text(stamp)
            # Swap the whole directory, so an importer never sees half of an old and half of a new set.
            old = out.with_name(out.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            if out.exists():
                os.rename(out, old)
            os.rename(staging, out)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protos", help="the directory holding turnstile/v1/*.proto")
    args = parser.parse_args()
    root = proto_root(args.protos)
    wrote = generate(root)
    print(f"protogen: {OUT.relative_to(HERE)} {'generated from' if wrote else 'up to date with'} {root}", file=sys.stderr)


if __name__ == "__main__":
    main()
