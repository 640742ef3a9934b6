"""deploy/dask/dask.yaml: every key one Dask knows, of the right type, sane thresholds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dask
import distributed
import yaml

from pipeline.run.orchestrate import WORKER_CONFIG
from tests.deploy.deploy_helpers import DASK_CONFIG, load, run, tool


def leaves(node: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in leaves(v, (*prefix, k))]
    return [prefix]


def test_every_key_is_a_dask_setting() -> None:
    # A misspelt key is silently ignored by Dask: compare with the shipped defaults.
    defaults: dict[str, Any] = {}
    for package in (dask, distributed):
        name = package.__name__
        with open(Path(package.__file__).parent / f"{name}.yaml") as f:
            dask.config.update(defaults, yaml.safe_load(f))
    for path in leaves(load(DASK_CONFIG)):
        node: Any = defaults
        for part in path:
            assert isinstance(node, dict) and part in node, f"unknown Dask setting {'.'.join(path)}"
            node = node[part]


def test_values_match_the_schemas_dask_and_distributed_ship(tmp_path: Path) -> None:
    schemas = {}
    for package in (dask, distributed):
        with open(Path(package.__file__).parent / f"{package.__name__}-schema.yaml") as f:
            schemas[package.__name__] = yaml.safe_load(f)
    merged = schemas["dask"]
    merged.setdefault("properties", {}).update(schemas["distributed"]["properties"])
    schema = tmp_path / "dask-config.schema.json"
    schema.write_text(json.dumps(merged))
    result = run([tool("check-jsonschema"), "--schemafile", str(schema), str(DASK_CONFIG)])
    assert result.returncode == 0, result.stdout + result.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(DASK_CONFIG.read_text().replace("allowed-failures: 5",
                                                   "allowed-failures: many"))
    assert run([tool("check-jsonschema"), "--schemafile", str(schema),
                str(bad)]).returncode == 1


def test_the_file_is_what_dask_then_runs_with() -> None:
    config = dask.config.collect(paths=[str(DASK_CONFIG.parent)], env={})
    with dask.config.set(config):
        assert dask.config.get("distributed.scheduler.allowed-failures") == 5
        memory = [dask.config.get(f"distributed.worker.memory.{k}")
                  for k in ("target", "spill", "pause", "terminate")]
        assert memory == sorted(memory) and memory[0] > 0 and memory[-1] < 1
        connect = dask.utils.parse_timedelta(
            dask.config.get("distributed.comm.timeouts.connect"))
        assert connect >= 30
        assert dask.config.get("temporary-directory") == "/scratch"
        # Workers keep glibc's own trim threshold (docs/scaling.md): the value is
        # unset (None), not distributed's 65536, exactly as the LocalCluster's.
        environ = dask.config.get("distributed.nanny.pre-spawn-environ")
        assert environ["MALLOC_TRIM_THRESHOLD_"] is None
        assert all(dask.config.get(k) == v for k, v in WORKER_CONFIG.items())
