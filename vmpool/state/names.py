"""VM hostnames, vmpooler style: ``<prefix><adjective>-<noun>-<suffix>``.

vmpooler names its VMs with an adjective and a noun (``spicy-proton``). vmpool adds a
short random suffix, so a fleet of thousands rarely collides. The store refuses a name
that was ever used (``reserve_vm`` -> ``name_taken``, tombstones included). A collision
costs one more draw, never a shared VM.

Every name is lowercase ``[a-z0-9-]``, starts with a letter or digit and is at most 63
characters (one DNS label). ``vmpool.ids.VM_NAME_RE`` accepts the same.

No global state: pass a ``random.Random`` (a seeded one in tests). The default is a
``random.SystemRandom``, so two worker processes forked from one parent do not draw the
same sequence.
"""

from __future__ import annotations

import random
import re

from vmpool.ids import VM_NAME_RE

__all__ = ["ADJECTIVES", "NOUNS", "NameGenerator", "generate_name"]

ADJECTIVES = (
    "amber", "ancient", "autumn", "billowing", "bitter", "black", "blue", "bold", "brave",
    "breezy", "brisk", "broken", "calm", "clever", "cold", "cool", "crimson", "curly",
    "damp", "dark", "dawn", "delicate", "divine", "dry", "empty", "eager", "falling",
    "fancy", "flat", "floral", "fragrant", "frosty", "gentle", "green", "hidden", "holy",
    "icy", "jolly", "late", "lingering", "little", "lively", "long", "lucky", "misty",
    "morning", "muddy", "nameless", "noisy", "odd", "old", "orange", "patient", "plain",
    "polished", "proud", "purple", "quiet", "rapid", "raspy", "red", "restless", "rough",
    "round", "royal", "shiny", "shrill", "shy", "silent", "small", "snowy", "soft",
    "solitary", "sparkling", "spicy", "spring", "square", "steep", "still", "summer",
    "super", "sweet", "swift", "throbbing", "tight", "tiny", "twilight", "wandering",
    "weathered", "white", "wild", "winter", "wispy", "withered", "yellow", "young",
)  # fmt: skip

NOUNS = (
    "art", "band", "bar", "base", "bird", "block", "boat", "bonus", "bread", "breeze",
    "brook", "bush", "butterfly", "cake", "cell", "cherry", "cloud", "credit", "darkness",
    "dawn", "dew", "disk", "dream", "dust", "feather", "field", "fire", "firefly", "flower",
    "fog", "forest", "frog", "frost", "glade", "glitter", "grass", "hall", "hat", "haze",
    "heart", "hill", "king", "lab", "lake", "leaf", "limit", "math", "meadow", "mode",
    "moon", "morning", "mountain", "mouse", "mud", "night", "paper", "pine", "poetry",
    "pond", "proton", "queen", "rain", "recipe", "resonance", "rice", "river", "salad",
    "scene", "sea", "shadow", "shape", "silence", "sky", "smoke", "snow", "snowflake",
    "sound", "star", "sun", "sunset", "surf", "term", "thunder", "tooth", "tree", "truth",
    "union", "unit", "violet", "voice", "water", "waterfall", "wave", "wildflower", "wind",
    "wood",
)  # fmt: skip

SUFFIX_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
SUFFIX_LENGTH = 5  # 36**5 ~ 60 million per word pair: collisions stay rare at fleet scale
MAX_NAME_LENGTH = 63
_PREFIX_RE = re.compile(r"[a-z0-9-]*")


def _check_prefix(prefix: str) -> str:
    # Room for the shortest body ("odd-art-xxxxx" is 13 characters). Config allows <= 32.
    # fullmatch: `$` alone would also match before a final newline
    if not _PREFIX_RE.fullmatch(prefix) or len(prefix) > MAX_NAME_LENGTH - 20:
        raise ValueError(f"hostname prefix must be lowercase [a-z0-9-], got {prefix!r}")
    if prefix.startswith("-"):
        raise ValueError(f"hostname prefix may not start with '-', got {prefix!r}")
    return prefix


def generate_name(prefix: str = "", rng: random.Random | None = None) -> str:
    """One random hostname: ``<prefix><adjective>-<noun>-<suffix>``, <= 63 characters."""
    rng = rng if rng is not None else random.SystemRandom()
    _check_prefix(prefix)
    suffix = "".join(rng.choice(SUFFIX_ALPHABET) for _ in range(SUFFIX_LENGTH))
    name = f"{prefix}{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}-{suffix}"
    if len(name) > MAX_NAME_LENGTH:  # a long prefix with long words: drop the noun
        name = f"{prefix}{rng.choice(ADJECTIVES)}-{suffix}"[:MAX_NAME_LENGTH]
    if not VM_NAME_RE.fullmatch(name):  # pragma: no cover - guarded by the checks above
        raise ValueError(f"generated an invalid hostname {name!r}")
    return name


class NameGenerator:
    """Draws hostnames for one prefix from one random source (no global state)."""

    def __init__(self, prefix: str = "", rng: random.Random | None = None) -> None:
        self.prefix = _check_prefix(prefix)
        self.rng = rng if rng is not None else random.SystemRandom()

    def __call__(self) -> str:
        return generate_name(self.prefix, self.rng)
