"""Constants every test and the fixtures share (one place: tests import them from here, never from a conftest)."""

from __future__ import annotations

import os

TEST_DIM = 64  # small vectors keep the suite fast; test_fidelity also runs the 1536-d default
# Set (`make test` sets it for its second pass over the core tests): every test database has memories
# and archived_memories hash-partitioned by user_id into this many partitions.
TEST_USER_PARTITIONS = int(os.environ.get("TEST_USER_PARTITIONS") or 0) or None
