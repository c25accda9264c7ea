"""examples/spark/spark-application.yaml: what the spark-operator would hand to ``submit.py``
must be a command line the jobs accept, with every path it names mounted (no Spark needed)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import click
import yaml

from cleaner.spark.cli import spark_group

REPO = Path(__file__).resolve().parents[2]
APPLICATION = yaml.safe_load((REPO / "examples" / "spark" / "spark-application.yaml").read_text())


def _mounted(path: str, mounts: list[dict]) -> bool:
    return any(PurePosixPath(m["mountPath"]) in (PurePosixPath(path), *PurePosixPath(path).parents) for m in mounts)


def test_the_arguments_are_a_valid_spark_compact_command_line() -> None:
    spec = APPLICATION["spec"]
    assert spec["mainApplicationFile"].endswith("/site-packages/cleaner/spark/submit.py")
    name, *args = spec["arguments"]
    command = spark_group.get_command(click.Context(spark_group), name)
    assert isinstance(command, click.Command), f"no command {name!r}"
    # Parse without converting: the paths exist only in the pods.
    with click.Context(command) as context:
        params, rest, _ = command.make_parser(context).parse_args(list(args))
    assert params["output"] is not None, "copy-on-write: snapshots are read only"
    assert params["now_ms"] is not None, "one clock for every executor"
    inputs = params.get("inputs") or rest
    assert inputs
    paths = [*inputs, params["output"], params["policy_path"]]
    for role in ("driver", "executor"):
        mounts = spec[role]["volumeMounts"]
        unmounted = [p for p in paths if not _mounted(p, mounts)]
        assert not unmounted, f"{role} does not mount {unmounted}"
        read_only = {m["mountPath"] for m in mounts if m.get("readOnly")}
        assert not _mounted(str(params["output"]), [{"mountPath": p} for p in read_only])


def test_speculation_is_off_and_failed_tasks_are_retried() -> None:
    conf = APPLICATION["spec"]["sparkConf"]
    assert conf["spark.speculation"] == "false"
    assert int(conf["spark.task.maxFailures"]) > 1
