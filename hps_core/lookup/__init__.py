"""Model lookups: keys -> embedding vectors for the tables of one model, on one device."""

from hps_core.lookup.model_lookup import LookupOptions, ModelLookup
from hps_core.lookup.table_lookup import CachedTableLookup, HostTableLookup, TableCounters

__all__ = ["CachedTableLookup", "HostTableLookup", "LookupOptions", "ModelLookup", "TableCounters"]
