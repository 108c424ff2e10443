"""consolidation definitions (autoloaded): monthly and yearly digests, facts, key moments, their checks."""
