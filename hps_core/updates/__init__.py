"""Online model updates over Kafka (ps.json ``update_source`` of type ``kafka_message_queue``).

- :mod:`hps_core.updates.messages`: HugeCTR's message layout and topic names.
- :mod:`hps_core.updates.producer`: :class:`UpdateProducer`, the training side.
- :mod:`hps_core.updates.consumer`: :class:`UpdateConsumer`, the serving side.

confluent-kafka is imported when a producer or consumer is made, not with this package.
"""

from hps_core.updates.consumer import UpdateConsumer, UpdateSourceError, UpdateStats
from hps_core.updates.messages import (
    MalformedMessageError,
    decode_message,
    encode_message,
    topic_for,
)
from hps_core.updates.producer import ChangeReport, PublishError, UpdateProducer

__all__ = [
    "ChangeReport",
    "MalformedMessageError",
    "PublishError",
    "UpdateConsumer",
    "UpdateProducer",
    "UpdateSourceError",
    "UpdateStats",
    "decode_message",
    "encode_message",
    "topic_for",
]
