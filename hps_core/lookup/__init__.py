"""Lookup sessions: keys -> embedding vectors for the tables of one model."""

from hps_core.lookup.model_lookup import ModelLookup, TableStats

__all__ = ["ModelLookup", "TableStats"]
