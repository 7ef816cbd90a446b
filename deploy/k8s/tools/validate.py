"""Validates rendered manifests offline; run by check.sh with the .ci/venv Python.

    validate.py --kubernetes-version 1.33 --crds DIR RENDERED.yaml

Every object is checked strictly (unknown fields are errors):
- built-in kinds with kubernetes-validate's bundled schemas (the same `utils.validate` the
  `kubernetes-validate --strict` command runs);
- kinds defined by a CustomResourceDefinition in DIR with that CRD's openAPIV3Schema, made strict the way
  the API server's strict field validation is (no unknown properties unless the schema preserves them);
- anything else is an ERROR: an object with no schema is never passed unchecked (kubernetes-validate
  itself only warns about those, e.g. a misspelled apiVersion).
Exit status 1 if any object fails.
"""

import argparse
import copy
import glob
import sys

import jsonschema
import yaml
from kubernetes_validate import utils


def strict(schema):
    """Copy of an OpenAPI v3 CRD schema with additionalProperties: false on every closed object."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


# metadata of a custom object is validated by the API server as ObjectMeta, not by the CRD schema;
# these are the fields a manifest may set.
OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def load_crds(directory):
    crds = {}
    for path in sorted(glob.glob(f"{directory}/*.yaml")):
        for doc in yaml.safe_load_all(open(path)):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for version in spec["versions"]:
                schema = strict(version["schema"]["openAPIV3Schema"])
                schema["properties"]["metadata"] = OBJECT_META
                schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                crds[key] = (schema, path)
    return crds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubernetes-version", required=True)
    parser.add_argument("--crds", required=True)
    parser.add_argument("rendered")
    args = parser.parse_args()

    crds = load_crds(args.crds)
    docs = [d for d in yaml.safe_load_all(open(args.rendered)) if d]
    failures = 0
    for doc in docs:
        api, kind = doc.get("apiVersion", "?"), doc.get("kind", "?")
        name = f"{kind}/{doc.get('metadata', {}).get('name', '?')} ({api})"
        if (api, kind) in crds:
            schema, path = crds[(api, kind)]
            errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
            if errors:
                failures += 1
                for e in errors:
                    where = ".".join(str(p) for p in e.path) or "<root>"
                    print(f"  ERROR {name}: {where}: {e.message} [CRD schema {path}]")
            else:
                print(f"  ok    {name}  [CRD: kubernetes-validate has no schema for it; checked against {path}]")
            continue
        try:
            version = utils.validate(doc, args.kubernetes_version, strict=True)
            print(f"  ok    {name}  [kubernetes-validate --strict, Kubernetes {version}]")
        except utils.ValidationError as e:
            failures += 1
            where = ".".join(str(p) for p in e.path) or "<root>"
            print(f"  ERROR {name}: {where}: {e.message} [kubernetes-validate --strict, Kubernetes {e.version}]")
        except utils.SchemaNotFoundError as e:
            failures += 1
            print(f"  ERROR {name}: {e.message}; not a built-in kind and no vendored CRD in {args.crds}: "
                  "refusing to pass it unchecked")
        except utils.VersionNotSupportedError as e:
            print(f"  FATAL {e.message}")
            return 2
    print(f"  {len(docs)} objects, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
