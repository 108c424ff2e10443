"""Text that looks like a credential: the well-known formats and any long random-looking token. Add
and update refuse it (InvalidInputError naming the field, the secret never echoed) unless the
caller passes allow_secrets=True; it is checked before the text reaches an embedding API."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

from ..core.config import SecretDetectionConfig
from ..core.errors import InvalidInputError

# Well-known credential formats. Each is specific enough that prose never matches it.
_SECRET_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private key block", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
    ("OpenAI/Anthropic-style API key", re.compile(r"\bsk-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_-]{20,}")),
    ("AWS access key id", re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b")),
    ("GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")),
    ("Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("Stripe secret key", re.compile(r"\b[rs]k_live_[A-Za-z0-9]{16,}")),
    ("Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("JSON Web Token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
)
# Anything else: a long unbroken token of random-looking characters (base62/base64). Random text
# mixes lower case, upper case and digits and switches between them at most characters; names
# (CamelCase), paths and words switch rarely, hex digests and UUIDs lack upper case.
_TOKEN_CANDIDATE = re.compile(r"[A-Za-z0-9+/=_\-]{8,}")  # looks_random applies the length policy
DEFAULT_SECRETS = SecretDetectionConfig()


def _char_class(c: str) -> int:
    return 0 if c.islower() else 1 if c.isupper() else 2 if c.isdigit() else 3


def looks_random(token: str, policy: SecretDetectionConfig = DEFAULT_SECRETS) -> bool:
    classes = [_char_class(c) for c in token]
    if len(token) < policy.min_token_length or not {0, 1, 2} <= set(classes):
        return False
    switches = sum(a != b for a, b in zip(classes, classes[1:], strict=False)) / (len(token) - 1)
    return switches >= policy.min_class_switch_ratio and shannon_entropy(token) >= policy.min_entropy_bits


def shannon_entropy(token: str) -> float:
    """Bits per character of the token's own character distribution."""
    counts = Counter(token)
    n = len(token)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


@dataclass(frozen=True)
class SecretFinding:
    kind: str
    start: int
    end: int

    def redacted(self, text: str) -> str:
        found = text[self.start : self.end]
        return f"{found[:4]}…({len(found)} chars)"


def find_secret(text: str, policy: SecretDetectionConfig = DEFAULT_SECRETS) -> SecretFinding | None:
    """The first credential-looking span of `text`, or None."""
    for kind, pattern in _SECRET_PATTERNS:
        m = pattern.search(text)
        if m:
            return SecretFinding(kind, m.start(), m.end())
    for m in _TOKEN_CANDIDATE.finditer(text):
        if looks_random(m.group(), policy):
            return SecretFinding("high-entropy token", m.start(), m.end())
    return None


def check_no_secret(field: str, text: str, policy: SecretDetectionConfig = DEFAULT_SECRETS) -> None:
    finding = find_secret(text, policy)
    if finding is not None:
        raise InvalidInputError(
            field,
            finding.redacted(text),
            f"looks like a secret ({finding.kind}); memories are not a secret store. "
            "Pass allow_secrets=True to store it anyway",
        )
