"""Online model updates over Kafka (ps.json ``update_source`` of type ``kafka_message_queue``).

- :mod:`hps_core.updates.messages`: HugeCTR's message layout and topic names.
- :mod:`hps_core.updates.producer`: :class:`UpdateProducer`, the training side.
- :mod:`hps_core.updates.consumer`: :class:`UpdateConsumer`, the serving side.
- :mod:`hps_core.updates.apply`: which tables take updates (``update_filters``) and how a
  message reaches the tiers and GPU caches of a serving instance.
- :mod:`hps_core.updates.broker_watch`: librdkafka's lines through Python logging, one line
  when the brokers go and one when they are back.

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
