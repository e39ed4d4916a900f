"""Validate every Kubernetes manifest under deploy/ against the API schemas
that the `kubernetes-validate` package ships (offline), in strict mode:
unknown fields are errors. Usage: validate_manifests.py VERSION... (e.g. 1.29.0).

Not validated here, each said in the output: kustomization.yaml files
(Kustomize's own config), configMapGenerator inputs (courier configs, checked
by `courier check` in tests/suite/deploy.rs), *-patch.yaml (partial objects: they
are validated as part of the rendered overlay, deploy/kustomize/example.rendered.yaml)
PodMonitor and PrometheusRule objects (CRDs without a shipped schema:
tests/suite/deploy.rs and tests/suite/monitoring.rs check them) and
deploy/monitoring/tests/ (promtool unit tests, run by tests/suite/monitoring.rs). A missing schema for any other kind is an error, so a
typo in apiVersion or kind cannot pass as "no schema".
"""

import pathlib
import sys

import kubernetes_validate
import yaml

CRDS = {("monitoring.coreos.com/v1", "PodMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
# promtool's unit tests of the alerts: not Kubernetes objects.
PROMTOOL_TESTS = pathlib.Path("deploy/monitoring/tests")


def generator_inputs(root):
    """Files named by a configMapGenerator: data, not manifests."""
    inputs = set()
    for k in root.rglob("kustomization.yaml"):
        for gen in yaml.safe_load(k.read_text()).get("configMapGenerator") or []:
            for f in gen.get("files") or []:
                inputs.add((k.parent / f.split("=")[-1]).resolve())
    return inputs


def main(versions):
    root = pathlib.Path("deploy")
    skip = generator_inputs(root)
    checked = failed = 0
    for path in sorted(root.rglob("*.yaml")):
        if path.name == "kustomization.yaml" or path.resolve() in skip:
            print(f"skip {path}: Kustomize input, not a manifest")
            continue
        if PROMTOOL_TESTS in path.parents:
            print(f"skip {path}: promtool unit test, run by tests/suite/monitoring.rs")
            continue
        if path.name.endswith("-patch.yaml"):
            print(f"skip {path}: partial object, validated in the rendered overlay")
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            what = f"{path} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            if (doc.get("apiVersion"), doc.get("kind")) in CRDS:
                print(f"skip {what}: CRD, shape checked by tests/suite/deploy.rs or monitoring.rs")
                continue
            for version in versions:
                checked += 1
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    failed += 1
                    print(f"FAIL {what} (k8s {version}): {'.'.join(map(str, e.path))}: {e.message}")
                except (kubernetes_validate.SchemaNotFoundError, KeyError):
                    failed += 1
                    print(f"FAIL {what} (k8s {version}): no schema for {doc.get('apiVersion')} {doc.get('kind')}")
    print(f"manifests: {checked - failed} passed, {failed} failed")
    return 1 if failed or not checked else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["1.29.0"]))
