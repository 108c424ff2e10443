"""dry_run definitions (autoloaded)."""
