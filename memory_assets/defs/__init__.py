"""Autoloaded by memory_assets.definitions: one folder per domain."""
