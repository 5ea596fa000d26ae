"""Connections and rows: database engines and schema, tables, Redis clients and scripts,
the cache, Redis keys, prepared statements and the driver cursor they are sent on."""
