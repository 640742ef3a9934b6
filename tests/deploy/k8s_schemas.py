"""JSON Schemas for the Dask operator's custom resources, generated from the CRDs that
the installed ``dask-kubernetes`` wheel ships (never vendored: a new operator release
brings its own schema with it).

The CRDs carry OpenAPI v3 structural schemas; JSON Schema differs in a few keywords,
translated here the way kubeconform's ``openapi2jsonschema`` does: ``nullable``,
``x-kubernetes-int-or-string``, and, in strict mode, ``additionalProperties: false``
on every object that lists its properties and does not keep unknown fields (the API
server would prune an unknown field silently: a typo must fail here instead).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

#: libyaml's loader where PyYAML has it: the CRDs are ~18,000 lines.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

#: Where the wheel keeps the fully expanded CRDs (the Helm chart's crds/ folder; the
#: operator/customresources/ ones are templates with references still to resolve).
CRD_GLOB = "operator/deployment/helm/*/crds/*.yaml"


@functools.cache
def crds() -> dict[str, Any]:
    """The CRDs of the installed dask-kubernetes, by kind (``DaskJob``, ...)."""
    import dask_kubernetes

    root = Path(dask_kubernetes.__file__).parent
    found: dict[str, Any] = {}
    for path in sorted(root.glob(CRD_GLOB)):
        with open(path) as f:
            crd = yaml.load(f, Loader=_Loader)
        if crd.get("kind") == "CustomResourceDefinition":
            found[crd["spec"]["names"]["kind"]] = {"path": path, "crd": crd}
    if not found:
        raise FileNotFoundError(f"no CRDs under {root}/{CRD_GLOB}; has the wheel's layout "
                                "changed?")
    return found


def crd_files() -> dict[str, Path]:
    """The CRD files of the installed dask-kubernetes, by kind."""
    return {kind: entry["path"] for kind, entry in crds().items()}


def to_json_schema(node: Any, *, strict: bool = True) -> Any:
    """Translate one OpenAPI v3 (structural) schema node into JSON Schema."""
    if isinstance(node, list):
        return [to_json_schema(n, strict=strict) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: to_json_schema(v, strict=strict) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not", "allOf", "anyOf", "oneOf"):
            out[key] = to_json_schema(value, strict=strict)
        elif key.startswith("x-kubernetes-") or key == "nullable":
            continue
        else:
            out[key] = copy.deepcopy(value)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out = {**out, "anyOf": [{"type": "integer"}, {"type": "string"}]}
    if node.get("nullable") and "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"]
    keeps_unknown = node.get("x-kubernetes-preserve-unknown-fields", False)
    if (strict and "properties" in out and "additionalProperties" not in out
            and not keeps_unknown):
        out["additionalProperties"] = False
    return out


def resource_schema(kind: str, version: str = "v1", *, strict: bool = True) -> dict[str, Any]:
    """A JSON Schema for one manifest of custom resource ``kind``: the CRD's schema of
    ``version``, with ``apiVersion``, ``kind`` and ``metadata`` as the API server
    checks them."""
    crd = crds()[kind]["crd"]
    group = crd["spec"]["group"]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    body = to_json_schema(served["schema"]["openAPIV3Schema"], strict=strict)
    properties = dict(body.get("properties", {}))
    properties.update({
        "apiVersion": {"const": f"{group}/{version}"},
        "kind": {"const": kind},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                # A DNS-1123 label: the operator derives Service and pod names from it.
                "name": {"type": "string", "maxLength": 63,
                         "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object",
                                "additionalProperties": {"type": "string"}},
            },
        },
    })
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": f"{kind} ({group}/{version}) from {crd_files()[kind].name}",
        **body,
        "type": "object",
        "required": sorted({"apiVersion", "kind", "metadata", *body.get("required", [])}),
        "properties": properties,
    }
