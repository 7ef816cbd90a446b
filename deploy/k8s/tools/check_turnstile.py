"""Checks a rendered overlay with the real `turnstile` binary; run by check.sh with the .ci/venv Python.

    check_turnstile.py --bin TURNSTILE RENDERED.yaml

kubernetes-validate knows the shape of a Deployment, not whether the container's command line is one
Turnstile accepts. For every container running the Turnstile image this:
1. expands its environment the way the kubelet does ($(VAR) from earlier `env` entries, `envFrom` ConfigMaps of
   the rendered overlay, the downward API as sample values) and runs `turnstile ARGS` with exactly that
   environment: a command line clap refuses (a flag given twice, two exclusive flags such as --auth-tokens
   and --jwt-key, a flag the binary does not have) exits 2 and fails the check. Anything past parsing fails
   on the files that only the cluster mounts (exit 1), which is expected here;
2. checks that every file the command line or the environment names under a mounted directory is there: a
   mount covers the directory, and a Secret or ConfigMap volume that lists `items` lists the file;
3. starts `turnstile dev` on the overlay's turnstile.toml (ConfigMap `turnstile-config`), with a dummy value
   for every `api_key_env` it names, and waits for it to listen: the shipped agents and models load.
Exit status 1 on any failure.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib

import yaml

SAMPLE_FIELDS = {"metadata.name": "turnstile-worker-0", "metadata.namespace": "turnstile", "status.podIP": "10.0.0.7"}
FAILURES = []


def fail(message):
    FAILURES.append(message)
    print(f"  ERROR {message}")


def expand(value, env):
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def container_env(container, configmaps):
    env = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref and ref["name"] in configmaps:
            env.update(configmaps[ref["name"]])
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = expand(entry["value"], env)
        elif "fieldRef" in entry.get("valueFrom", {}):
            env[entry["name"]] = SAMPLE_FIELDS.get(entry["valueFrom"]["fieldRef"]["fieldPath"], "sample")
    return env


def check_files(name, container, volumes, values):
    mounts = container.get("volumeMounts", [])
    for value in values:
        for path in re.findall(r"(/etc/turnstile/[\w./-]+)", value):
            mount = next((m for m in mounts if path.startswith(m["mountPath"].rstrip("/") + "/")), None)
            if mount is None:
                fail(f"{name}: {path} is named but no volume is mounted over it")
                continue
            volume = volumes.get(mount["name"], {})
            source = volume.get("secret") or volume.get("configMap") or {}
            items = source.get("items")
            relative = path[len(mount["mountPath"].rstrip("/")) + 1 :]
            if items is not None and relative not in [i["path"] for i in items]:
                fail(f"{name}: {path} is named but volume {mount['name']} does not project {relative}")


def check_command_line(binary, name, args, env):
    run_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NO_COLOR": "1", **env}
    try:
        out = subprocess.run([binary, *args], env=run_env, capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        print(f"  ok    {name}: command line accepted (still running after 20 s)")
        return
    first = next((l for l in out.stderr.splitlines() if l.startswith("error")), out.stderr.strip()[:200])
    if out.returncode == 2:
        fail(f"{name}: turnstile refuses the command line: {first}")
    else:
        print(f"  ok    {name}: command line accepted (then, outside the cluster: {first})")


def check_config(binary, name, text):
    with tempfile.TemporaryDirectory() as scratch:
        config = os.path.join(scratch, "turnstile.toml")
        ready = os.path.join(scratch, "ready.json")
        with open(config, "w") as f:
            f.write(text)
        keys = {}
        for model in tomllib.loads(text).get("models", {}).values():
            if "api_key_env" in model:
                keys[model["api_key_env"]] = "check-sh-dummy-key"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NO_COLOR": "1", **keys}
        log = open(os.path.join(scratch, "log"), "w+")
        process = subprocess.Popen(
            [binary, "dev", "--config", config, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
             "--ready-file", ready], env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    with open(ready) as f:
                        if json.load(f).get("pid") == process.pid:
                            print(f"  ok    {name}: turnstile.toml loads and its agents start (keys: "
                                  f"{', '.join(sorted(keys)) or 'none'})")
                            return
                except (OSError, ValueError):
                    pass
                time.sleep(0.1)
            log.seek(0)
            fail(f"{name}: `turnstile dev --config turnstile.toml` did not start:\n{log.read()[-2000:]}")
        finally:
            process.kill()
            process.wait()
            log.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("rendered")
    args = parser.parse_args()
    docs = [d for d in yaml.safe_load_all(open(args.rendered)) if d]
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    # Generated names carry a hash suffix; the pods reference them by the rendered (suffixed) name.
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec = doc["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec["containers"]:
            if "turnstile" not in container["image"].rsplit("/", 1)[-1]:
                continue
            name = f"{doc['kind']}/{doc['metadata']['name']}/{container['name']}"
            env = container_env(container, configmaps)
            command_line = [expand(a, env) for a in container.get("args", [])]
            check_files(name, container, volumes, command_line + list(env.values()))
            check_command_line(args.bin, name, command_line, env)
    for name, data in configmaps.items():
        if name.startswith("turnstile-config") and "turnstile.toml" in data:
            check_config(args.bin, f"ConfigMap/{name}", data["turnstile.toml"])
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
