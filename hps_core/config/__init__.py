"""ps.json configuration: HugeCTR's schema, aliases and defaults as typed, frozen dataclasses.

Load a ps.json with :func:`load_ps_config` (or validate a decoded dict with
:func:`parse_ps_config`); every problem in the file is reported at once in a
:class:`~hps_core.errors.ConfigError`. ``PSConfig.to_dict`` writes a ps.json back with
HugeCTR's key names. :mod:`hps_core.config.parse` documents where this differs from HugeCTR's
parser and docs.
"""

from hps_core.config.enums import (
    DatabaseType,
    EmbeddingCacheType,
    OverflowPolicy,
    UpdateSourceType,
)
from hps_core.config.parse import load_ps_config, parse_ps_config
from hps_core.config.schema import (
    ModelConfig,
    PersistentDBConfig,
    PSConfig,
    TableConfig,
    UpdateSourceConfig,
    VolatileDBConfig,
    default_table_name,
)

__all__ = [
    "DatabaseType",
    "EmbeddingCacheType",
    "ModelConfig",
    "OverflowPolicy",
    "PSConfig",
    "PersistentDBConfig",
    "TableConfig",
    "UpdateSourceConfig",
    "UpdateSourceType",
    "VolatileDBConfig",
    "default_table_name",
    "load_ps_config",
    "parse_ps_config",
]
