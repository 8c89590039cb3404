"""Configuration fields set from text (`realsim calibrate --set NAME=VALUE`).

`with_overrides(cfg, pairs)` returns a copy of a dataclass config with fields read from
strings as the type of each field's current value: numbers, `true`/`false`,
comma-separated tuples (`4,2,1`), `none` for fields that may be None.
"""

from __future__ import annotations

import dataclasses
import difflib

from realsim_core.errors import RealsimError


def parse_setting(key: str, text: str, current, optional: tuple = (), what: str = "setting",
                  annotation: str = ""):
    """`text` as a value of `current`'s type; `optional`: field names that may be None.

    A field whose current value is None is read as its `annotation` says (`int | None`:
    an integer), otherwise as a float.
    """
    t = text.strip()
    int_or_none = current is None and str(annotation).startswith("int")
    try:
        if t.lower() == "none":
            if current is None or key in optional:
                return None
            raise ValueError
        if isinstance(current, bool):
            if t.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise ValueError
            return t.lower() in ("true", "1", "yes", "on")
        if isinstance(current, tuple):
            kind = (type(current[0]) if current
                    else str if "str" in str(annotation) else float)
            return tuple(kind(x.strip()) for x in t.split(",") if x.strip())
        if isinstance(current, int) or int_or_none:
            return int(t)
        if isinstance(current, float) or current is None:
            return float(t)
        return t
    except ValueError:
        want = ("none or an integer" if int_or_none
                else "none or a number" if key in optional or current is None
                else type(current).__name__)
        raise RealsimError(f"{what} {key}: cannot read {text!r} as {want}") from None


def with_overrides(cfg, pairs, optional: tuple = (), what: str = "setting"):
    """A copy of dataclass `cfg` with fields set from (name, text) pairs (`parse_setting`).

    Unknown names raise RealsimError with the nearest field name; the copy is built with
    `dataclasses.replace`, so the config's own validation (`__post_init__`) runs.
    """
    annotations = {f.name: f.type for f in dataclasses.fields(cfg)}
    names = set(annotations)
    kw = {}
    for key, text in pairs:
        if key not in names:
            close = difflib.get_close_matches(key, sorted(names), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise RealsimError(f"unknown {what} {key!r}{hint}")
        kw[key] = parse_setting(key, text, getattr(cfg, key), optional, what, annotations[key])
    return dataclasses.replace(cfg, **kw)
