"""Validate a ps.json and every file it names, without loading the tables.

Used by ``hps check`` and by the Triton models' ``initialize``: a broken model fails fast with
one line per problem instead of failing on its first request.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from hps_core.config import ModelConfig, PSConfig, load_ps_config
from hps_core.config.inert import inert_settings
from hps_core.errors import ConfigError, HPSError, ModelFileError, NotAvailableError, Problem
from hps_core.footprint import ModelFootprint, model_footprint
from hps_core.formats.keys import check_unique_keys
from hps_core.formats.sparse import KEY_FILE, SparseTableInfo, inspect_sparse_table, read_keys
from hps_core.infer.inputs.layout import (
    is_ranking_model,
    load_ranking_graph,
    ps_json_disagreements,
)
from hps_core.tiers.backing import table_tag
from hps_core.tiers.factory import check_tiers_available
from hps_core.wording import plural

logger = logging.getLogger("hps_core")


@dataclass
class ModelReport:
    """What ``check`` found for one model.

    Args:
        model: the model's configuration.
        tables: the inspected sparse table of each table index (None where it is broken).
        footprint: the bytes each tier will hold (:mod:`hps_core.footprint`); None unless
            every table was inspected.
        network_warnings: its ps.json sizing fields that disagree with its network (also in
            the report's ``warnings``).
    """

    model: ModelConfig
    tables: list[SparseTableInfo | None] = field(default_factory=list)
    footprint: ModelFootprint | None = None
    network_warnings: list[str] = field(default_factory=list)


@dataclass
class CheckReport:
    """Result of :func:`check_ps_json`.

    Args:
        config: the parsed ps.json, or None if it does not parse.
        models: per-model findings.
        problems: every problem, each naming its ps.json field or file.
        warnings: fields set without effect here, with what HugeCTR would do
            (:func:`hps_core.config.inert.inert_settings`).
    """

    config: PSConfig | None
    models: list[ModelReport] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


def _check_file(where: str, path: Path | None, problems: list[Problem]) -> None:
    if path is not None and not path.is_file():
        problems.append(Problem(where, f"file not found: {path}"))


def check_ps_json(
    path: str | os.PathLike[str],
    model_name: str | None = None,
    network: bool = True,
    keys: bool = False,
) -> CheckReport:
    """Check a ps.json and the files of its models (all, or just ``model_name``).

    Args:
        path: the ps.json.
        model_name: check only this model.
        network: also check the network of each model that has one (``network_file`` and
            ``dense_file``) against its tables and dense file, and its ps.json sizing fields
            against the network (warnings). An embedding model never reads its network.
        keys: also read every table's keys and refuse a key file that repeats one (the host
            tier refuses it when it loads the table; a model's load leaves that check to it).

    Returns:
        The report; ``report.problems`` is empty when everything is usable.
    """
    try:
        config = load_ps_config(path)
    except ConfigError as exc:
        return CheckReport(None, problems=list(exc.problems))
    report = CheckReport(config)
    try:
        check_tiers_available(config)
    except HPSError as exc:
        field_name, _, message = str(exc).partition(": ")
        report.problems.append(Problem(field_name, message))
    models = [
        (m, model) for m, model in enumerate(config.models) if model_name in (None, model.name)
    ]
    if not models:
        report.problems.append(
            Problem(
                "models",
                f"no model named '{model_name}'; the ps.json has "
                + ", ".join(f"'{model.name}'" for model in config.models),
            )
        )
    report.warnings = inert_settings(config, models[0][1] if model_name and models else None)
    for m, model in models:
        model_report = ModelReport(model)
        report.models.append(model_report)
        problems_before = len(report.problems)
        where = f"models[{m}]"
        _check_file(f"{where}.dense_file", model.dense_file, report.problems)
        _check_file(f"{where}.network_file", model.network_file, report.problems)
        for table in model.tables:
            try:
                info = inspect_sparse_table(table.sparse_file, table.dim)
                if keys:
                    where_keys = str(info.path / KEY_FILE)
                    check_unique_keys(read_keys(info.path, info.rows), where_keys)
            except HPSError as exc:
                info = None
                message = str(exc) + relative_path_hint(config, table.sparse_file)
                report.problems.append(Problem(f"{where}.sparse_files[{table.index}]", message))
            model_report.tables.append(info)
        if all(info is not None for info in model_report.tables):
            rows = [info.rows for info in model_report.tables if info is not None]
            model_report.footprint = model_footprint(config, model, rows)
        if network and is_ranking_model(model) and len(report.problems) == problems_before:
            _check_network(model_report, where, report)
    return report


def relative_path_hint(config: PSConfig, path: Path | str) -> str:
    """Where a missing path given relative in the ps.json exists from the current folder
    instead (HugeCTR reads it from the server's folder; here from the ps.json's): say so.

    Args:
        config: the parsed ps.json.
        path: one of its file paths, as resolved (against the ps.json's folder).

    Returns:
        The hint, from `` (`` on, or ``""`` when the path exists, was given absolute, or does
        not exist from the current folder either.
    """
    if config.source_path is None or not isinstance(path, Path) or path.exists():
        return ""
    try:
        relative = path.relative_to(config.source_path.parent)
    except ValueError:  # given absolute
        return ""
    if not (Path.cwd() / relative).exists():
        return ""
    return (
        f" (a relative path in a ps.json is read from its folder, {config.source_path.parent}; "
        f"{relative} exists from the current folder: give it from the ps.json's folder, or "
        "absolute)"
    )


def _check_network(model_report: ModelReport, where: str, report: CheckReport) -> None:
    model = model_report.model
    try:
        _, layout = load_ranking_graph(model, where)
    except ConfigError as exc:
        report.problems += exc.problems
    except ModelFileError as exc:
        report.problems.append(Problem(f"{where}.network_file", str(exc)))
    except NotAvailableError as exc:
        # hps repo serves a model with a network as a ranking model, which would not load.
        # (HugeCTR's hps backend, which serves only lookups, does not check its network.)
        report.problems += exc.problems or [Problem(f"{where}.network_file", str(exc))]
    else:
        model_report.network_warnings = ps_json_disagreements(model, layout, where)
        report.warnings += model_report.network_warnings


def check_connections(config: PSConfig, timeout_s: float = 5.0) -> tuple[list[Problem], list[str]]:
    """Try the servers a ps.json names outside this machine's files: its Redis cluster
    (``volatile_db``) and its Kafka brokers (``update_source``).

    Args:
        config: the parsed ps.json.
        timeout_s: how long the brokers may take to answer.

    Returns:
        ``(problems, notes)``: a problem per server that does not answer or refuses us (naming
        the ps.json field), a note per server that answers, with what it holds.
    """
    from hps_core.config import DatabaseType, UpdateSourceType

    problems: list[Problem] = []
    notes: list[str] = []
    volatile = config.volatile_db
    if volatile.type is DatabaseType.REDIS_CLUSTER:
        from hps_core.tiers.redis_store import RedisClusterStore

        try:
            store = RedisClusterStore(volatile)
        except ConfigError as exc:  # refused: password, TLS certificate
            problems += exc.problems
        except HPSError as exc:  # no node answers
            message = str(exc).removeprefix(f"volatile_db.address '{volatile.address}': ")
            problems.append(Problem("volatile_db.address", f"'{volatile.address}': {message}"))
        else:
            with store:
                held = _held(config, store.tables())
                nodes = store.primary_nodes
            notes.append(
                f"Redis cluster at {volatile.address}: {plural(nodes, 'primary node')} answer "
                f"and hold rows of {held} (servers fill their tables when they first start)"
            )
    source = config.update_source
    if source.type is UpdateSourceType.KAFKA_MESSAGE_QUEUE:
        problem, note = _try_kafka(config, timeout_s)
        if problem is not None:
            problems.append(problem)
        else:
            notes.append(note)
    return problems, notes


def _try_kafka(config: PSConfig, timeout_s: float) -> tuple[Problem | None, str]:
    """A problem if ``update_source.brokers`` do not answer, else a note of what they hold."""
    from confluent_kafka.admin import AdminClient

    from hps_core.updates.kafka_conf import bootstrap_servers

    brokers = config.update_source.brokers
    try:
        # Connection failures come back as the exception below; librdkafka's own log
        # would repeat each of them on stderr, 20 lines a second.
        client = AdminClient({"bootstrap.servers": bootstrap_servers(brokers), "log_level": 0})
        topics = client.list_topics(timeout=timeout_s).topics
    except ValueError as exc:
        return Problem("update_source.brokers", str(exc)), ""
    except Exception as exc:  # KafkaException: no broker answered in time
        reason = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
        return Problem("update_source.brokers", f"no answer from '{brokers}': {reason}"), ""
    return None, (
        f"Kafka brokers at {brokers} answer and have the topics of {_held(config, list(topics))}"
        " (servers create their tables' topics when they start)"
    )


def _held(config: PSConfig, names: list[str]) -> str:
    """``K of T tables of the ps.json``: those in ``names``, the listing of a database or a
    broker (a table's rows may be stored under its tag with an ``@precision`` suffix)."""
    stored = {name.partition("@")[0] for name in names}
    tags = [table_tag(model.name, table.name) for model in config.models for table in model.tables]
    return f"{sum(tag in stored for tag in tags)} of {plural(len(tags), 'table')} of the ps.json"


def check_model_files(
    path: str | os.PathLike[str],
    model_name: str,
    network: bool = True,
    source: str | os.PathLike[str] | None = None,
) -> ModelReport:
    """Check one model of a ps.json; raise with every problem found and log each warning:
    the warnings ``hps check`` prints for the same ps.json and model.

    Args:
        path: the ps.json.
        model_name: the model to check.
        network: check its network too (see :func:`check_ps_json`).
        source: the ps.json the user wrote, when ``path`` is a copy written from it (the
            translation of a HugeCTR repository, :mod:`hps_core.hugectr_repo`): every
            problem and warning names it instead of the copy, and the warnings are those of
            ``hps check`` on it (a copy keeps no key given twice, no list HugeCTR fits),
            with the copy's network warnings (its network may be named by config.pbtxt).

    Returns:
        The model's report: its configuration, tables and tier bytes.

    Raises:
        ConfigError: listing every problem.
    """
    report = check_ps_json(path, model_name, network)
    if source is not None:
        report.problems = [_located(p, Path(path), Path(source)) for p in report.problems]
    if report.problems:
        raise ConfigError(report.problems)
    warnings = report.warnings
    if source is not None:
        warnings = _source_warnings(Path(source), model_name, report)
    for line in warnings:
        logger.warning("%s: %s", path if source is None else source, line)
    return report.models[0]


def _located(problem: Problem, copy: Path, source: Path) -> Problem:
    """``problem`` of the copy ``copy`` of the ps.json ``source``, naming ``source``."""
    where = problem.where.replace(str(copy), str(source))
    if str(source) not in where:
        where = f"{source}: {where}"
    return Problem(where, problem.message.replace(str(copy), str(source)))


def _source_warnings(source: Path, model_name: str, report: CheckReport) -> list[str]:
    """The warnings of the user's ps.json ``source`` for ``model_name`` (as ``hps check``
    words them) and the copy's network warnings; the copy's own warnings when ``source`` no
    longer reads (edited since the copy was written: the next translation reports it)."""
    try:
        config = load_ps_config(source)
        model = config.model(model_name)
    except ConfigError:
        return report.warnings
    return inert_settings(config, model) + report.models[0].network_warnings
