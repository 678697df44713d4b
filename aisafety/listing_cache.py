"""A cache of ``aisafety list``'s answers, so listing starts in well under a second.

Listing describes every registered plugin, and registering them imports them all, torch
included (3-4 s of CPU). The answer changes only when the code does, so it is kept in
``$AISAFETY_CACHE_DIR`` (default ``~/.cache/aisafety``) under a key made of the platform
version, the Python executable, the installed ``aisafety`` entry points and the size and
modification time of every source file of the platform and of each plugin's package, and of
every zoo manifest (``AISAFETY_ZOO_PATH`` included). Any change gives a new key; a listing
with a broken plugin is never cached (its error must show each time). ``AISAFETY_LIST_CACHE=0``
turns the cache off. Only the standard library is imported here.

The very first listing has no cache yet, and would pay for importing torch (9-12 s on a
busy 2-core machine, issue #36). Where only the built-ins are installed (no ``aisafety``
entry point, no ``AISAFETY_ZOO_PATH``), it is answered from ``builtin_listing.json``, the
built-ins' listing shipped with the package (``write_shipped`` makes it;
tests/test_listing_cache.py fails, naming the command, when it differs from the live one).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from importlib import metadata
from pathlib import Path

from aisafety.version import __version__

PACKAGE = Path(__file__).resolve().parent
SUFFIXES = {".py", ".json"}
SHIPPED = PACKAGE / "builtin_listing.json"
BUILTIN_ZOO = "<the built-in zoo>"  # a models entry's source, as shipped (a path here)


def enabled() -> bool:
    return os.environ.get("AISAFETY_LIST_CACHE", "1") != "0"


def cache_dir() -> Path:
    if os.environ.get("AISAFETY_CACHE_DIR"):
        return Path(os.environ["AISAFETY_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "aisafety"


def _stamps(root: Path) -> list[tuple[str, int, int]]:
    if root.is_file():
        stat = root.stat()
        return [(str(root), stat.st_mtime_ns, stat.st_size)]
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if Path(name).suffix in SUFFIXES:
                stat = os.stat(os.path.join(folder, name))
                found.append((os.path.join(folder, name), stat.st_mtime_ns, stat.st_size))
    return sorted(found)


def _plugin_roots() -> tuple[list[list[str]], list[Path]]:
    """The entry points (name, value, distribution, version) and their packages' folders,
    found without importing them (a top-level module's spec needs no import)."""
    points, roots = [], []
    for ep in metadata.entry_points(group="aisafety"):
        dist = getattr(ep, "dist", None)
        points.append([ep.name, ep.value, dist.name if dist else "", dist.version if dist else ""])
        try:
            spec = importlib.util.find_spec(ep.value.split(":")[0].split(".")[0])
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            origin = Path(spec.origin)
            roots.append(origin.parent if origin.name == "__init__.py" else origin)
    return sorted(points), roots


def _zoo_manifests() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("AISAFETY_ZOO_PATH", "").split(os.pathsep) if p]
    spec = importlib.util.find_spec("aisafety.data")
    builtin = [Path(p) for p in spec.submodule_search_locations] if spec else []
    return [root / "zoo" / "manifest.json" for root in builtin] + [
        root / "manifest.json" for root in extra
    ]


def key(kind: str) -> str:
    points, roots = _plugin_roots()
    stamps = [_stamps(PACKAGE)] + [_stamps(r) for r in roots if r.exists()]
    stamps += [_stamps(m) for m in _zoo_manifests() if m.is_file()]
    text = json.dumps(
        [__version__, sys.executable, kind, points, os.environ.get("AISAFETY_ZOO_PATH"), stamps]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def read(kind: str) -> list[dict] | None:
    if not enabled():
        return None
    try:
        return json.loads((cache_dir() / f"list-{kind}-{key(kind)}.json").read_text())
    except (OSError, ValueError):
        return shipped(kind)


def only_builtins() -> bool:
    """No plugin and no extra zoo installed: the built-ins' listing is the whole answer."""
    return not os.environ.get("AISAFETY_ZOO_PATH") and not metadata.entry_points(group="aisafety")


def shipped(kind: str) -> list[dict] | None:
    """The built-ins' listing shipped with this version, where it is the whole answer."""
    if not only_builtins():
        return None
    try:
        listing = json.loads(SHIPPED.read_text())
    except (OSError, ValueError):
        return None
    entries = listing.get("kinds", {}).get(kind) if listing.get("version") == __version__ else None
    if entries is None:
        return None
    zoo = [str(m.parent) for m in _zoo_manifests()]
    return [
        {**e, "source": zoo[0]} if e.get("source") == BUILTIN_ZOO and zoo else e for e in entries
    ]


def write_shipped(listings: dict[str, list[dict]]) -> None:
    """``builtin_listing.json`` from the live listing of every kind (built-ins only)."""
    zoo = {str(m.parent) for m in _zoo_manifests()}
    kinds = {
        kind: [{**e, "source": BUILTIN_ZOO} if e.get("source") in zoo else e for e in entries]
        for kind, entries in listings.items()
    }
    text = json.dumps({"version": __version__, "kinds": kinds}, indent=1, sort_keys=True)
    SHIPPED.write_text(text + "\n")


def write(kind: str, entries: list[dict]) -> None:
    """Best effort: a read-only home only means the next listing is slow again."""
    if not enabled():
        return
    try:
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob(f"list-{kind}-*.json"):  # stale keys of this kind
            old.unlink(missing_ok=True)
        path = folder / f"list-{kind}-{key(kind)}.json"
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(entries))
        temporary.replace(path)
    except OSError:
        pass
