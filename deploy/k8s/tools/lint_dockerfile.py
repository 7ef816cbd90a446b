"""Offline lint of deploy/Dockerfile (no container engine runs in CI, so the image is never built there).

    lint_dockerfile.py PATH

Checks what can be checked without building: every base image pinned (explicit tag or digest, never
`latest`; the rust builder by its full x.y.z version), `cargo build --release -p turnstile --locked`, the
final stage (and every other stage with an ENTRYPOINT: the MCP variant) runs as a non-root USER and
installs ca-certificates (unless distroless), exec-form ENTRYPOINT ["turnstile"], EXPOSE 7400 7500 9090.
Exit status 1 on any failure.
"""

import json
import re
import sys


def instructions(text):
    joined, buf = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        op, _, rest = buf.partition(" ")
        joined.append((op.upper(), rest.strip()))
        buf = ""
    return joined


def main(path):
    ins = instructions(open(path).read())
    errors = []
    args, stages = {}, []
    for op, rest in ins:
        if op == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        elif op == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            # A stage built FROM an earlier one inherits its instructions (USER, ENTRYPOINT, …).
            parent = next((st for st in stages if st["name"] == image), None)
            inherited = list(parent["ins"]) if parent else []
            stages.append({"image": parent["image"] if parent else image, "name": name, "ins": inherited,
                           "from_stage": parent is not None})
        elif stages:
            stages[-1]["ins"].append((op, rest))
    if not stages:
        errors.append("no FROM")
        return report(path, errors)

    names = {}
    for op, rest in ins:
        if op == "FROM":
            words = rest.split()
            if len(words) >= 3 and words[-2].upper() == "AS":
                names[words[-1]] = True
    for stage in stages:
        image = stage["image"]
        if stage["from_stage"] or image in names or image == "scratch":
            continue
        if "$" in image:
            errors.append(f"FROM {image}: unresolved build argument (give the ARG a pinned default)")
            continue
        repo, digest = image.partition("@")[0], image.partition("@")[2]
        tag = repo.rsplit(":", 1)[1] if ":" in repo.rsplit("/", 1)[-1] else ""
        if not digest and not tag:
            errors.append(f"FROM {image}: base image not pinned (no tag or digest)")
        elif tag == "latest" and not digest:
            errors.append(f"FROM {image}: `latest` is not a pin")
        if re.match(r"^(docker\.io/)?(library/)?rust:", image) and not re.match(r"\d+\.\d+\.\d+", tag):
            errors.append(f"FROM {image}: the rust builder must be pinned by its full version (x.y.z)")

    runs = [rest for s in stages if not s["from_stage"] for op, rest in s["ins"] if op == "RUN"]
    cargo = [r for r in runs if "cargo build" in r]
    if not cargo:
        errors.append("no `cargo build` RUN step")
    for r in cargo:
        for flag in ("--locked", "--release", "-p turnstile"):
            if flag not in r:
                errors.append(f"`cargo build` without {flag}")

    # Every stage that is an image to run (the last one, and any other with an ENTRYPOINT, such as the MCP
    # variant) gets the same checks.
    images = [s for s in stages[:-1] if any(op == "ENTRYPOINT" for op, _ in s["ins"])] + [stages[-1]]
    for final in images:
        check_image(final, errors)
    return report(path, errors, stages)


def check_image(final, errors):
    users = [rest for op, rest in final["ins"] if op == "USER"]
    if not users:
        errors.append("final stage has no USER: the container would run as root")
    else:
        user = users[-1].split(":")[0].strip()
        if user in ("root", "0", ""):
            errors.append(f"final stage USER {users[-1]} is root")
        elif not user.isdigit():
            errors.append(f"final stage USER {users[-1]}: use a numeric UID so runAsNonRoot can verify it")
    if "distroless" not in final["image"] and not any("ca-certificates" in r for op, r in final["ins"] if op == "RUN"):
        errors.append("final stage does not install ca-certificates")
    entry = [rest for op, rest in final["ins"] if op == "ENTRYPOINT"]
    try:
        ok = bool(entry) and json.loads(entry[-1])[0] in ("turnstile", "/usr/local/bin/turnstile")
    except (ValueError, IndexError):
        ok = False
    if not ok:
        errors.append('final stage needs an exec-form ENTRYPOINT ["turnstile"]')
    exposed = {p.split("/")[0] for op, r in final["ins"] if op == "EXPOSE" for p in r.split()}
    missing = {"7400", "7500", "9090"} - exposed
    if missing:
        errors.append(f"EXPOSE is missing {' '.join(sorted(missing))}")


def report(path, errors, stages=()):
    for e in errors:
        print(f"  ERROR {path}: {e}")
    if not errors:
        print(f"  ok    {path}: bases {', '.join(s['image'] for s in stages)}; non-root USER; --locked; "
              "ENTRYPOINT turnstile; EXPOSE 7400 7500 9090 (image build itself not tested here)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
