"""Cache keys: the name of one specialization, and why a kernel whose key
changed is compiled again (the reason MLIRGPU_LOG=compile prints)."""
from __future__ import annotations

import hashlib
import types
from collections.abc import Mapping

__all__ = ["CacheKey", "recompile_reason", "label"]


class CacheKey:
    """The name of one specialization: an ordered mapping of part names to
    strings, e.g. {"kernel": "mod.qualname", "source": <sha256>, "globals":
    <sha256>, "generics": "M=256,dtype=f32", "chip": "sm_90a", "options":
    "opt_level=3"}. `digest` (sha256, hex) covers the parts in order.
    `details` (part -> {name: readable value}) only explains recompiles; it is
    not part of the digest or of equality."""

    __slots__ = ("parts", "details", "digest")

    def __init__(self, parts: Mapping[str, str], details: Mapping[str, Mapping[str, object]] | None = None) -> None:
        parts = dict(parts)
        for name, value in parts.items():
            if not isinstance(name, str) or not name or not isinstance(value, str):
                raise TypeError(f"CacheKey parts map non-empty str to str, got {name!r}: {value!r}")
        clean = {}
        for part, mapping in (details or {}).items():
            if part not in parts:
                raise ValueError(f"CacheKey details for {part!r}, which is not a part ({', '.join(parts)})")
            clean[part] = {str(k): str(v) for k, v in mapping.items()}
        digest = hashlib.sha256(b"mlirgpu-cache-key-1\0")
        # Length prefixes make the encoding injective: no two keys share bytes.
        for name, value in parts.items():
            n, v = name.encode(), value.encode()
            digest.update(b"%d:%s%d:%s" % (len(n), n, len(v), v))
        object.__setattr__(self, "parts", types.MappingProxyType(parts))
        object.__setattr__(self, "details", types.MappingProxyType(clean))
        object.__setattr__(self, "digest", digest.hexdigest())

    def __setattr__(self, name, value):
        raise AttributeError("CacheKey is immutable")

    @property
    def kernel(self) -> str:
        """The "kernel" part, or "" where there is none."""
        return self.parts.get("kernel", "")

    def __eq__(self, other):
        return isinstance(other, CacheKey) and self.digest == other.digest

    def __hash__(self):
        return hash(self.digest)

    def __repr__(self):
        return f"CacheKey({dict(self.parts)!r})"


def _pairs(text):
    """{"M": "256", ...} for "M=256,K=128", or None if text is not that shape."""
    items = {}
    for item in text.split(","):
        name, eq, value = item.partition("=")
        if not eq or not name or name in items:
            return None
        items[name] = value
    return items


def _describe(part, old, new, old_details, new_details):
    if old_details is not None and new_details is not None:
        names = list(old_details) + [n for n in new_details if n not in old_details]
        changes = [f"{n}: {old_details.get(n, '<unset>')} -> {new_details.get(n, '<unset>')}"
                   for n in names if old_details.get(n) != new_details.get(n)]
        return f"{part} changed ({', '.join(changes)})" if changes else f"{part} changed"
    old_items, new_items = _pairs(old), _pairs(new)
    if old_items is not None and new_items is not None:
        names = list(old_items) + [n for n in new_items if n not in old_items]
        changes = []
        for n in names:
            if n not in new_items:
                changes.append(f"{n}={old_items[n]} removed")
            elif n not in old_items:
                changes.append(f"{n}={new_items[n]} added")
            elif old_items[n] != new_items[n]:
                changes.append(f"{n}={old_items[n]} -> {n}={new_items[n]}")
        return f"{part} changed ({', '.join(changes)})"
    is_digest = len(new) >= 32 and all(c in "0123456789abcdef" for c in new)
    if len(old) <= 40 and len(new) <= 40 and not is_digest:
        return f"{part} changed ({old} -> {new})"
    return f"{part} changed"


def recompile_reason(previous: CacheKey | None, key: CacheKey) -> str:
    if previous is None:
        return "first compile"
    if previous == key:
        return "not cached (key unchanged since its last use)"
    reasons = []
    for part, value in key.parts.items():
        if part not in previous.parts:
            reasons.append(f"{part} added")
        elif previous.parts[part] != value:
            reasons.append(_describe(part, previous.parts[part], value,
                                     previous.details.get(part), key.details.get(part)))
    reasons += [f"{part} removed" for part in previous.parts if part not in key.parts]
    return "; ".join(reasons)


def label(key: CacheKey) -> str:
    shown = [f"{part} {key.parts[part]}" for part in ("generics", "chip") if part in key.parts]
    name = key.kernel or key.digest[:16]
    return f"{name} [{', '.join(shown)}]" if shown else name
