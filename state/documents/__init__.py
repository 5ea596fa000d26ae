"""Stored JSON documents: the codec, quarantine, bulk migration."""
