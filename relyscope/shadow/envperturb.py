"""Environment perturbations of recorded tool results (metrics.md §4 "env").

Each perturbation is a pure, seeded, meaning-preserving function of one recorded tool result: the
same facts in a different surface form, as a different deployment or API version of the tool could
return them. The result may be any JSON value (dict / list / str / int / float / bool / None); a
``str`` that holds a JSON object or array is decoded first and re-encoded (``json.dumps``,
``ensure_ascii=False``) after, so the agent still receives a string.

Transforms (:data:`ENV_TRANSFORMS`), applied in this order whatever order they are asked for:

``us_dates``
    every string that is exactly an ISO 8601 date or date-time (``YYYY-MM-DD``, optionally
    ``[T ]HH:MM[:SS[.ffffff]]`` and ``Z`` / ``±HH:MM``) becomes US ``MM/DD/YYYY``, with the time
    (12-hour clock, the original's precision, ``AM``/``PM``) and zone (``UTC`` for ``Z``, else the
    offset) when present: ``2026-03-01T14:05:00Z`` -> ``03/01/2026 02:05:00 PM UTC``.
``epoch_dates``
    the same strings become unix epoch seconds (int, or float when there are fractional seconds);
    a date alone is its midnight and a time without zone is read as UTC.
``thousands_separators``
    every int/float (never a bool; not NaN/inf) becomes a string with comma thousands separators:
    ``12345.5`` -> ``"12,345.5"``, ``42`` -> ``"42"``. Runs after the date transforms, so epoch
    seconds get separators too.
``camel_case_keys`` / ``kebab_case_keys``
    every dict key in snake_case (``^[a-z][a-z0-9]*(_[a-z][a-z0-9]*)+$``) becomes camelCase
    (``order_id`` -> ``orderId``) or kebab-case (``order-id``); other keys are kept, and so is a key
    whose new name is already taken in its dict. Mutually exclusive.
``reorder_keys``
    the keys of every dict are shuffled; a dict of two or more keys never keeps its order. List
    order is meaningful and never changed.
``wrap_status``
    the whole result becomes ``{"status": "ok", "data": <result>}`` (last, so the wrapper itself
    is not renamed or reordered).

Strengths (:data:`ENV_STRENGTHS`) choose the transforms, among those that *apply* to the result
(would change it; ``wrap_status`` always applies), with a :class:`random.Random` seeded from a
BLAKE2b hash of ``(seed, strength)``:

- ``mild``: ``reorder_keys`` if it applies, plus one of {``camel_case_keys``, ``us_dates``,
  ``wrap_status``} drawn uniformly among those that apply.
- ``medium``: ``reorder_keys`` if it applies, plus two distinct families drawn uniformly among the
  applicable ones of {key case, dates, numbers, wrap} (just one if only one applies); within key
  case camel or kebab and within dates US or epoch, uniformly among those that apply.
- ``severe``: every applicable family: ``reorder_keys``, ``kebab_case_keys``, ``epoch_dates``,
  ``thousands_separators``, ``wrap_status``.

The input is never mutated. Values that are not JSON (tuples, sets, datetime objects, non-str
keys) raise ``TypeError``.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any, Final

__all__ = [
    "ENV_STRENGTHS",
    "ENV_TRANSFORMS",
    "EnvPerturbation",
    "apply_transforms",
    "perturb_result",
]

ENV_STRENGTHS: Final[tuple[str, ...]] = ("mild", "medium", "severe")

ENV_TRANSFORMS: Final[tuple[str, ...]] = (
    "us_dates",
    "epoch_dates",
    "thousands_separators",
    "camel_case_keys",
    "kebab_case_keys",
    "reorder_keys",
    "wrap_status",
)

_EXCLUSIVE: Final = ({"us_dates", "epoch_dates"}, {"camel_case_keys", "kebab_case_keys"})


@dataclass(frozen=True)
class EnvPerturbation:
    """A perturbed tool result.

    Attributes:
        value: the perturbed result (same kind of value as the input: a JSON-holding ``str`` stays
            a ``str``).
        transforms: names from :data:`ENV_TRANSFORMS` that were applied, in application order;
            each one changed the value.
    """

    value: Any
    transforms: tuple[str, ...]


_ISO_RE: Final = re.compile(
    r"(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})"
    r"(?:(?P<sep>[T ])(?P<h>\d{2}):(?P<mi>\d{2})(?::(?P<s>\d{2})(?P<frac>\.\d{1,6})?)?"
    r"(?P<tz>Z|[+-]\d{2}:\d{2})?)?"
)
_SNAKE_RE: Final = re.compile(r"[a-z][a-z0-9]*(?:_[a-z][a-z0-9]*)+")


def _parse_iso(s: str) -> tuple[re.Match[str], datetime] | None:
    m = _ISO_RE.fullmatch(s)
    if m is None:
        return None
    try:
        if m["h"] is None:
            d = date(int(m["y"]), int(m["mo"]), int(m["d"]))
            return m, datetime(d.year, d.month, d.day, tzinfo=timezone.utc)
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None
    return m, dt if dt.tzinfo is not None else dt.replace(tzinfo=timezone.utc)


def _us_date(s: str) -> str | None:
    parsed = _parse_iso(s)
    if parsed is None:
        return None
    m, _ = parsed
    out = f"{m['mo']}/{m['d']}/{m['y']}"
    if m["h"] is None:
        return out
    hour = int(m["h"])
    h12 = hour % 12 or 12
    clock = f"{h12:02d}:{m['mi']}"
    if m["s"] is not None:
        clock += f":{m['s']}{m['frac'] or ''}"
    out += f" {clock} {'AM' if hour < 12 else 'PM'}"
    if m["tz"] is not None:
        out += " UTC" if m["tz"] == "Z" else f" {m['tz']}"
    return out


def _epoch(s: str) -> int | float | None:
    parsed = _parse_iso(s)
    if parsed is None:
        return None
    _, dt = parsed
    whole = calendar.timegm(dt.utctimetuple())
    if dt.microsecond == 0:
        return whole
    return whole + dt.microsecond / 1_000_000


def _thousands(x: int | float) -> str:
    return format(x, ",")


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _kebab(key: str) -> str:
    return key.replace("_", "-")


def _check_json(value: Any, path: str = "$") -> None:
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if isinstance(value, list):
        for i, v in enumerate(value):
            _check_json(v, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"tool result is not JSON: non-string key {k!r} at {path}")
            _check_json(v, f"{path}.{k}")
        return
    raise TypeError(f"tool result is not JSON: {type(value).__name__} at {path}")


def _map_scalars(value: Any, fn: Any) -> Any:
    """A copy of ``value`` with ``fn`` applied to every non-container value (``fn`` returns the
    replacement, or the same object to keep it)."""
    if isinstance(value, dict):
        return {k: _map_scalars(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_scalars(v, fn) for v in value]
    return fn(value)


def _dates_to(value: Any, conv: Any) -> Any:
    def fn(v: Any) -> Any:
        if isinstance(v, str):
            new = conv(v)
            return v if new is None else new
        return v
    return _map_scalars(value, fn)


def _numbers_to_strings(value: Any) -> Any:
    def fn(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return v
        if isinstance(v, float) and not math.isfinite(v):
            return v
        return _thousands(v)
    return _map_scalars(value, fn)


def _rename_keys(value: Any, rename: Any) -> Any:
    if isinstance(value, list):
        return [_rename_keys(v, rename) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    taken = set(value)
    for k, v in value.items():
        new = rename(k) if _SNAKE_RE.fullmatch(k) else k
        if new != k and new in taken:
            new = k  # the new name already exists in this dict: keep the original key
        taken.add(new)
        out[new] = _rename_keys(v, rename)
    return out


def _reorder(value: Any, rng: random.Random) -> Any:
    if isinstance(value, list):
        return [_reorder(v, rng) for v in value]
    if not isinstance(value, dict):
        return value
    keys = list(value)
    if len(keys) >= 2:
        shuffled = keys[:]
        rng.shuffle(shuffled)
        if shuffled == keys:
            shuffled = shuffled[1:] + shuffled[:1]
        keys = shuffled
    return {k: _reorder(value[k], rng) for k in keys}


def _apply_one(name: str, value: Any, rng: random.Random) -> Any:
    if name == "us_dates":
        return _dates_to(value, _us_date)
    if name == "epoch_dates":
        return _dates_to(value, _epoch)
    if name == "thousands_separators":
        return _numbers_to_strings(value)
    if name == "camel_case_keys":
        return _rename_keys(value, _camel)
    if name == "kebab_case_keys":
        return _rename_keys(value, _kebab)
    if name == "reorder_keys":
        return _reorder(value, rng)
    if name == "wrap_status":
        return {"status": "ok", "data": value}
    raise AssertionError(name)  # pragma: no cover - names are validated before


def _walk(value: Any) -> Iterable[Any]:
    yield value
    if isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)


def _applies(name: str, value: Any) -> bool:
    """Whether transform ``name`` would change ``value``."""
    if name == "wrap_status":
        return True
    nodes = list(_walk(value))
    if name in ("us_dates", "epoch_dates"):
        return any(isinstance(n, str) and _parse_iso(n) is not None for n in nodes)
    if name == "thousands_separators":
        return any(not isinstance(n, bool) and isinstance(n, (int, float))
                   and not (isinstance(n, float) and not math.isfinite(n)) for n in nodes)
    if name == "reorder_keys":
        return any(isinstance(n, dict) and len(n) >= 2 for n in nodes)
    # key renames: some snake_case key whose new name is free in its dict
    rename = _camel if name == "camel_case_keys" else _kebab
    return any(isinstance(n, dict) and any(_SNAKE_RE.fullmatch(k) and rename(k) not in n for k in n)
               for n in nodes)


def _rng(seed: int, label: str) -> random.Random:
    material = json.dumps(["relyscope.shadow.envperturb", seed, label], separators=(",", ":"))
    return random.Random(int.from_bytes(hashlib.blake2b(material.encode(), digest_size=16).digest(), "big"))


def _decode(result: Any) -> tuple[Any, bool]:
    if isinstance(result, str):
        stripped = result.lstrip()
        if stripped[:1] in ("{", "["):
            try:
                return json.loads(result), True
            except ValueError:
                pass
    _check_json(result)
    return result, False


def _run(decoded: Any, names: Sequence[str], rng: random.Random, was_str: bool) -> EnvPerturbation:
    ordered = [n for n in ENV_TRANSFORMS if n in names]
    value = decoded
    for name in ordered:
        value = _apply_one(name, value, rng)
    if was_str:
        value = json.dumps(value, ensure_ascii=False)
    return EnvPerturbation(value=value, transforms=tuple(ordered))


def apply_transforms(result: Any, transforms: Iterable[str], *, seed: int = 0) -> EnvPerturbation:
    """Apply the named transforms to ``result`` (in the canonical order of :data:`ENV_TRANSFORMS`;
    ``seed`` drives ``reorder_keys``). Transforms that would not change the value are skipped and
    left out of ``transforms``.

    Raises:
        ValueError: an unknown transform name, or both of a mutually exclusive pair
            (``us_dates``/``epoch_dates``, ``camel_case_keys``/``kebab_case_keys``).
        TypeError: ``result`` is not a JSON value, ``seed`` not an int.
    """
    names = list(transforms)
    unknown = sorted(set(names) - set(ENV_TRANSFORMS))
    if unknown:
        raise ValueError(f"unknown env transform(s) {unknown}; known: {list(ENV_TRANSFORMS)}")
    for pair in _EXCLUSIVE:
        if pair <= set(names):
            raise ValueError(f"env transforms {sorted(pair)} are mutually exclusive")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    decoded, was_str = _decode(result)
    return _run(decoded, [n for n in names if _applies(n, decoded)], _rng(seed, "apply"), was_str)


_FAMILIES: Final[dict[str, tuple[str, ...]]] = {
    "key_case": ("camel_case_keys", "kebab_case_keys"),
    "dates": ("us_dates", "epoch_dates"),
    "numbers": ("thousands_separators",),
    "wrap": ("wrap_status",),
}


def perturb_result(result: Any, *, seed: int, strength: str = "medium") -> EnvPerturbation:
    """Perturb one recorded tool result at ``strength`` (``mild`` | ``medium`` | ``severe``; the
    module docstring lists exactly what each applies). Pure: same ``result``, ``seed`` and
    ``strength`` give the same output; ``result`` is not mutated.

    Raises:
        ValueError: unknown ``strength``.
        TypeError: ``result`` is not a JSON value, ``seed`` not an int.
    """
    if strength not in ENV_STRENGTHS:
        raise ValueError(f"unknown env strength {strength!r}; expected one of {list(ENV_STRENGTHS)}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    decoded, was_str = _decode(result)
    rng = _rng(seed, strength)
    chosen: list[str] = ["reorder_keys"] if _applies("reorder_keys", decoded) else []
    if strength == "mild":
        pool = [n for n in ("camel_case_keys", "us_dates", "wrap_status") if _applies(n, decoded)]
        chosen.append(rng.choice(pool))
    elif strength == "medium":
        applicable = {f: [m for m in members if _applies(m, decoded)] for f, members in _FAMILIES.items()}
        families = [f for f, members in applicable.items() if members]
        for fam in rng.sample(families, min(2, len(families))):
            chosen.append(rng.choice(applicable[fam]))
    else:
        chosen += [n for n in ("kebab_case_keys", "epoch_dates", "thousands_separators", "wrap_status")
                   if _applies(n, decoded)]
    return _run(decoded, chosen, rng, was_str)
