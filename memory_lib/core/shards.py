"""User shards: several runs archive one night concurrently, each over its own users.

Shard i of n holds the users whose stable hash (Postgres `hashtextextended(user_id, 0)`, the same on
every server and version) is i modulo n. So a user is never split across shards (the order of one
user's memories holds), the shards of n are disjoint and together cover every user, and two runs of
different shards never wait on each other's rows. Shard 0 of 1 (the default) is every user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import InvalidInputError

# A cap keeps the hash buckets meaningful and a typo (10000/1 for 1/10000) visible.
MAX_SHARDS = 1024


@dataclass(frozen=True)
class Shard:
    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        for name, value in (("shard_count", self.count), ("shard_index", self.index)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidInputError(name, value, "must be an integer")
        if not 1 <= self.count <= MAX_SHARDS:
            raise InvalidInputError("shard_count", self.count, f"must be between 1 and {MAX_SHARDS}")
        if not 0 <= self.index < self.count:
            raise InvalidInputError(
                "shard_index", self.index, f"must be between 0 and shard_count-1={self.count - 1}"
            )

    @classmethod
    def parse(cls, text: str, *, field: str = "shard") -> Shard:
        """'i/n' (e.g. '0/4'); an error names `field` and the text."""
        parts = text.strip().split("/") if isinstance(text, str) else []
        try:
            index, count = (int(p) for p in parts)
        except ValueError:
            raise InvalidInputError(
                field, text, "must be 'i/n' with integers 0 <= i < n, e.g. '0/4'"
            ) from None
        if not 1 <= count <= MAX_SHARDS or not 0 <= index < count:
            raise InvalidInputError(field, text, f"must be 'i/n' with 0 <= i < n <= {MAX_SHARDS}, e.g. '0/4'")
        return cls(index, count)

    @property
    def is_all(self) -> bool:
        return self.count == 1

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def batch_suffix(self) -> str:
        """'' for every user, else '-shard-iofn': concurrent shard runs of one night hold separate batches."""
        return "" if self.is_all else f"-shard-{self.index}of{self.count}"

    def params(self) -> dict[str, Any]:
        return {"shard_index": self.index, "shard_count": self.count}


ALL = Shard()


def shard_filter(user_id_sql: str) -> str:
    """A SQL condition true for the users of the shard in %(shard_index)s / %(shard_count)s.

    The hash's sign bit is masked (abs() of the smallest bigint would overflow)."""
    return (
        f"(%(shard_count)s::bigint = 1 OR mod(hashtextextended({user_id_sql}, 0) & 9223372036854775807, "
        f"%(shard_count)s::bigint) = %(shard_index)s::bigint)"
    )
