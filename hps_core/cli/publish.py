"""``hps publish``: send embedding rows to the inference servers through Kafka.

Rows go to the topic of the table (``hps_et.<model>.<table>``) in HugeCTR's message format,
so servers with ``update_source`` of type ``kafka_message_queue`` apply them, ours or
HugeCTR's.

Brokers that do not answer: the command exits 2 with one line naming them and saying what was
published (nothing, when they were unreachable from the start: the topic's metadata is asked
for first, for up to 10 s). Messages queued before an outage wait for the brokers up to
librdkafka's delivery timeout (5 minutes) and are then counted as not delivered.

Example:
    hps publish --brokers 127.0.0.1:9092 --model dlrm --table sparse_embedding0 \\
        --sparse model/0_sparse_model
    hps publish --brokers kafka:9092 --model dlrm --table t0 --parquet emb.parquet
    hps publish --brokers kafka:9092 --model dlrm --table t0 --changed old/0_sparse new/0_sparse
"""

from __future__ import annotations

import argparse
import difflib
import time

from hps_core.cli.arguments import positive_int
from hps_core.updates.messages import DEFAULT_SEND_BUFFER_SIZE, parse_tag, topic_for
from hps_core.updates.producer import (
    DEFAULT_NUM_KEY_GROUPS,
    DEFAULT_TOPIC_PARTITIONS,
    PublishError,
    UpdateProducer,
)


def _publish(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    try:
        topic = topic_for(args.model, args.table)
        producer = UpdateProducer(
            args.brokers,
            send_buffer_size=args.send_buffer_size,
            max_batch_size=args.max_batch_size,
            num_key_groups=args.key_groups,
            topic_partitions=args.partitions,
            key_bytes=4 if args.int32_keys else 8,
            linger_ms=args.linger_ms,
        )
    except ValueError as exc:  # a bad name or broker list: one line, no traceback
        raise PublishError(str(exc)) from exc
    with producer:
        try:
            if not args.create_topic:
                existing = producer.existing_topics()
                _check_topic(args.model, args.table, topic, existing, args.brokers)
            report = None
            if args.sparse is not None:
                sent = producer.publish_sparse(args.model, args.table, args.sparse, args.dim)
            elif args.parquet is not None:
                sent = producer.publish_parquet(
                    args.model,
                    args.table,
                    args.parquet,
                    key_column=args.key_column,
                    vector_column=args.vector_column,
                    dim=args.dim,
                )
            else:
                old, new = args.changed
                report = producer.publish_changed(args.model, args.table, old, new, args.dim)
                sent = report.sent
            producer.flush()
        except PublishError as exc:
            raise PublishError(f"{exc}; {_published(producer, topic)}") from exc
        messages = producer.messages_sent
    seconds = time.perf_counter() - start
    rate = sent / seconds if seconds > 0 else 0.0
    print(
        f"sent {sent} keys in {messages} messages to {topic} at {args.brokers} "
        f"in {seconds:.2f} s ({rate:,.0f} keys/s)"
    )
    if report is not None:
        print(
            f"{report.rows} rows in the new table: {report.added} added, {report.changed} "
            f"changed, {report.unchanged} unchanged (not sent); {report.removed} keys only in "
            f"the old table (not sent: updates cannot delete)"
        )
    return 0


def _published(producer: UpdateProducer, topic: str) -> str:
    """What reached the brokers before a failure, for its error line."""
    delivered, queued = producer.messages_delivered, producer.messages_sent
    if not delivered:
        return f"nothing was published to {topic}"
    return (
        f"{delivered} of {queued} messages to {topic} were acknowledged (servers apply "
        "those; publish again for the rest)"
    )


def _check_topic(model: str, table: str, topic: str, existing: set[str], brokers: str) -> None:
    """Refuse a topic no server has made: the servers create their tables' topics when they
    start, so a missing one is usually a misspelt model or table, whose rows nobody would
    ever read."""
    if topic in existing:
        return
    tags = []
    for name in existing:
        try:
            tags.append(parse_tag(name))
        except ValueError:  # not a table's topic
            continue
    tables = sorted(other for owner, other in tags if owner == model)
    if tables:
        close = difflib.get_close_matches(table, tables, n=1, cutoff=0.6)
        hint = f'; did you mean --table "{close[0]}"?' if close else ""
        known = f"the tables of model {model!r} there: {', '.join(tables)}{hint}"
    else:
        close = difflib.get_close_matches(model, sorted({owner for owner, _ in tags}), n=1)
        hint = f'; did you mean --model "{close[0]}"?' if close else ""
        known = f"no table of model {model!r} has a topic there{hint}"
    raise PublishError(
        f"topic {topic!r} does not exist at {brokers} ({known}). Servers create the topics "
        "of their tables when they start; pass --create-topic to publish before any has"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``hps publish`` to the ``hps`` parser.

    Args:
        subparsers: the top-level subparsers of ``hps``.
    """
    parser = subparsers.add_parser(
        "publish",
        help="send embedding rows to the servers through Kafka (online updates)",
        description="Publish the rows of a sparse model folder, of a Parquet table, or only "
        "those that changed between two sparse folders, to the Kafka topic of a table in "
        "HugeCTR's update format. Prints the keys sent and the rate.",
    )
    parser.add_argument(
        "--brokers",
        required=True,
        help="Kafka brokers, host[:port] separated by ';' or ',' (ps.json update_source.brokers)",
    )
    parser.add_argument("--model", required=True, help="model name (ps.json 'model')")
    parser.add_argument("--table", required=True, help="table name (embedding_table_names)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--sparse", metavar="DIR", help="HugeCTR sparse model folder")
    source.add_argument("--parquet", metavar="PATH", help="Parquet file or folder of parts")
    source.add_argument(
        "--changed",
        nargs=2,
        metavar=("OLD_DIR", "NEW_DIR"),
        help="only the keys of NEW_DIR that are new or whose vector differs from OLD_DIR",
    )
    parser.add_argument(
        "--dim", type=positive_int, help="floats per vector (default: from the data)"
    )
    parser.add_argument("--key-column", default="key", help="Parquet key column (default: key)")
    parser.add_argument(
        "--vector-column", default="vector", help="Parquet vector column (default: vector)"
    )
    parser.add_argument(
        "--send-buffer-size",
        type=positive_int,
        default=DEFAULT_SEND_BUFFER_SIZE,
        help="largest message in bytes; match the servers' receive_buffer_size "
        f"(default: {DEFAULT_SEND_BUFFER_SIZE})",
    )
    parser.add_argument(
        "--max-batch-size",
        type=positive_int,
        help="at most this many rows per message (the servers' max_batch_size; default: "
        "only --send-buffer-size limits)",
    )
    parser.add_argument(
        "--key-groups",
        type=positive_int,
        default=DEFAULT_NUM_KEY_GROUPS,
        help=f"key groups spread over partitions (default: {DEFAULT_NUM_KEY_GROUPS})",
    )
    parser.add_argument(
        "--partitions",
        type=positive_int,
        default=DEFAULT_TOPIC_PARTITIONS,
        help=f"partitions of the topic if it must be created (default: {DEFAULT_TOPIC_PARTITIONS})",
    )
    parser.add_argument(
        "--int32-keys",
        action="store_true",
        help="4-byte keys, for models with supportlonglong false",
    )
    parser.add_argument(
        "--create-topic",
        action="store_true",
        help="publish even if no server has created the table's topic yet (it is created "
        "with --partitions partitions; by default a missing topic is refused as a likely typo)",
    )
    parser.add_argument(
        "--linger-ms",
        type=int,
        default=100,
        help="how long messages gather before a request (HugeCTR: 100)",
    )
    parser.set_defaults(func=_publish)
