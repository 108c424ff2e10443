"""common definitions (autoloaded)."""
