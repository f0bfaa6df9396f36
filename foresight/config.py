"""The one validation layer for user input: config dataclasses, ``key=value`` strings, YAML and JSON files, devices.

Every check here raises :class:`ConfigError` (a :class:`~foresight.errors.ForesightError`, so the command line
prints it as one line with exit status 2) naming the offending file, key or value:

* :func:`check_fields` checks every field of a dataclass against its annotation (``int``, ``float``, ``bool``,
  ``str``, ``list[...]``, ``dict``, ``X | None``; other annotations are not checked). Trainer configs and policy
  hyperparameters call it on construction, so ``lr: fast``, ``steps: [1, 2]``, ``hidden: "16"``, ``lr=.inf`` or
  ``seed=abc`` fail before any work starts (a ``float`` must be finite). Coercions are the lossless ones only: an
  integral float to an ``int`` field (``steps=1e3``) and a number written as a string to a ``float`` field (YAML
  1.1 reads ``1e-4`` as a string).
* :func:`parse_overrides` reads ``key=value`` strings as YAML scalars;
* YAML goes through :func:`foresight.safe_yaml.load_yaml` (safe tags, a key given twice is an error, size and
  alias expansion bounded);
* :func:`read_yaml_mapping` and :func:`read_json` read a file and name it in every error;
* :func:`check_device` checks a device string (``cpu``, ``cuda``, ``cuda:1``) before a model is loaded;
* :func:`check_adapter` checks a PEFT adapter directory (the ``adapter`` key, ``--adapter``) the same way;
* argparse types (:data:`positive_int`, :func:`unit_float`, :func:`device_arg` ...) refuse a bad command-line
  value as a usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import numbers
import re
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable

import yaml

from foresight.errors import ForesightError
from foresight.safe_yaml import load_yaml


class ConfigError(ForesightError, ValueError):
    """A config value, key=value argument or input file that cannot be used as given."""


_FLOAT_TEXT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_NAMES = {"int": "an integer", "float": "a finite number", "bool": "true or false", "str": "a string", "list": "a list",
          "dict": "a mapping", "None": "null"}


def _alternatives(annotation) -> list[str] | None:
    """``"int | None"`` -> ``["int", "None"]``; None when the annotation is not one this module checks."""
    if isinstance(annotation, str):
        text = annotation
    else:  # a real type (module without ``from __future__ import annotations``): list[str], int | None, int
        text = str(annotation) if getattr(annotation, "__args__", None) else getattr(annotation, "__name__", "?")
    text = text.replace("typing.", "").replace("NoneType", "None").strip()
    if text.startswith("Optional[") and text.endswith("]"):
        text = f"{text[9:-1]} | None"
    alts = []
    for part in (p.strip() for p in text.split("|")):
        base = part.split("[", 1)[0]
        if base not in _NAMES:
            return None  # Any, a class, a Callable ...: not checked here
        alts.append(part)
    return alts


def _element_type(alt: str) -> str | None:
    """``"list[str]"`` -> ``"str"``; None for a bare ``list``."""
    return alt[alt.index("[") + 1 : -1].strip() if "[" in alt else None


def _coerce_one(alt: str, value, key: str, owner: str):
    """``value`` as type ``alt``, or ``TypeError``; a bad list element raises :class:`ConfigError` naming it."""
    base = alt.split("[", 1)[0]
    if base == "None":
        if value is None:
            return None
    elif base == "bool":
        if isinstance(value, bool):
            return value
    elif base == "int":
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
    elif base == "float":
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
            return value  # nan and inf refused (lr=.inf trains to NaN; no key means "unlimited" by inf)
        if isinstance(value, str) and _FLOAT_TEXT.match(value.strip()) and math.isfinite(float(value)):
            return float(value)  # "1e400" reads as inf: refused like .inf
    elif base == "str":
        if isinstance(value, str):
            return value
    elif base == "list":
        if isinstance(value, (list, tuple)):
            inner = _element_type(alt)
            return [check_value(f"{key}[{i}]", v, inner, owner) if inner else v for i, v in enumerate(value)]
    elif base == "dict":
        if isinstance(value, dict):
            return value
    raise TypeError


def check_value(key: str, value, annotation, owner: str = "config key"):
    """``value`` checked against ``annotation`` (see the module docstring); raises :class:`ConfigError` naming
    ``key``. Unchecked annotations return ``value`` unchanged."""
    alts = _alternatives(annotation)
    if alts is None:
        return value
    for alt in alts:
        try:
            return _coerce_one(alt, value, key, owner)
        except TypeError:
            continue
    expected = " or ".join(_describe(a) for a in alts)
    raise ConfigError(f"{owner} `{key}` must be {expected}, got {_show(value)}")


def _describe(alt: str) -> str:
    inner = _element_type(alt)
    return f"a list of {inner} values" if inner else _NAMES[alt.split("[", 1)[0]]


def _show(value) -> str:
    kind = {str: "a string", list: "a list", dict: "a mapping", bool: "a boolean"}.get(type(value))
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{text} ({kind})" if kind and not isinstance(value, bool) else text


def check_fields(obj, owner: str = "config key") -> None:
    """Check (and losslessly coerce, in place) every init field of the dataclass instance ``obj``."""
    for f in fields(obj):
        if f.init and not f.name.startswith("_"):
            setattr(obj, f.name, check_value(f.name, getattr(obj, f.name), f.type, owner))


def check_kwargs(cls, kwargs: dict, owner: str) -> dict:
    """``kwargs`` for the dataclass ``cls`` with each value checked against its field (unknown keys untouched)."""
    types = {f.name: f.type for f in fields(cls) if f.init}
    return {k: check_value(k, v, types[k], owner) if k in types else v for k, v in kwargs.items()}


def check_keys(data, known: Iterable[str], what: str) -> dict:
    """``data`` must be a mapping whose keys are all in ``known``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must be a mapping of keys to values, got {_show(data)}")
    known = set(known)
    bad = sorted(str(k) for k in data if k not in known)
    if bad:
        raise ConfigError(f"unknown {what} key(s) {', '.join(bad)}; valid keys: {', '.join(sorted(known))}")
    return data


def parse_scalar(text: str):
    """A ``key=value`` value as a YAML scalar (numbers, booleans, null, strings, ``[a, b]`` lists)."""
    try:
        parsed = load_yaml(text)
    except yaml.YAMLError:
        return text  # not YAML (e.g. "a: b: c"): keep the text; the field's type check decides
    if isinstance(parsed, str) and _FLOAT_TEXT.match(parsed.strip()):
        parsed = float(parsed)  # YAML 1.1 reads "2e-4" (no dot) as a string
    return parsed


def parse_overrides(items: Iterable[str]) -> dict:
    """``["lr=0.1", "steps=5"]`` -> ``{"lr": 0.1, "steps": 5}``; a later item wins."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"expected KEY=VALUE, got {item!r}")
        out[key.strip()] = parse_scalar(value)
    return out


def read_text(path: str | Path, what: str) -> str:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a directory, not a file")
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from None


def read_yaml_mapping(path: str | Path, what: str = "config file") -> dict:
    """The mapping in a YAML file (empty file: ``{}``; :func:`load_yaml`); errors name the file and line."""
    text = read_text(path, what)
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: invalid YAML ({problem})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of keys to values, not {type(data).__name__}")
    return data


def read_json(path: str | Path, what: str = "JSON file", expect: type | tuple | None = dict) -> Any:
    """The JSON value in ``path`` (of type ``expect`` when given); every error names the file."""
    text = read_text(path, what)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what} {path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if expect is not None and not isinstance(data, expect):
        names = " or ".join(t.__name__ for t in (expect if isinstance(expect, tuple) else (expect,)))
        want = {"dict": "an object", "list": "a list"}.get(names, names)
        raise ConfigError(f"{what} {path} must hold {want}, got {type(data).__name__}")
    return data


def check_device(device: str | None, key: str = "device") -> str | None:
    """A device string torch understands and this machine has; None (the default device) passes."""
    if device is None:
        return None
    import torch  # here, not at the top: the command line's argument types import this module

    if not isinstance(device, str) or not device.strip():
        raise ConfigError(f"{key}: expected a device name such as cpu, cuda or cuda:1, got {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"{key}: unknown device {device!r}; use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{key}: {device!r} asked for, but CUDA is not available on this machine; use cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"{key}: {device!r} asked for, but this machine has {torch.cuda.device_count()} "
                              "CUDA device(s)")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError(f"{key}: {device!r} asked for, but MPS is not available on this machine")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{key}: unsupported device {device!r}; use cpu, cuda, cuda:N or mps")
    return device


# ----------------------------------------------------------------------------------------------------------------
# argparse types: a bad command-line value is a one-line usage error (exit status 2) before any work
# ----------------------------------------------------------------------------------------------------------------


def _int_at_least(minimum: int, what: str, maximum: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
        return value

    parse.__name__ = "int"
    return parse


positive_int = _int_at_least(1, "a positive integer")
nonnegative_int = _int_at_least(0, "an integer >= 0")
MAX_SEED = 2**63 - 1  # what torch's generators take
seed_int = _int_at_least(0, f"an integer in [0, {MAX_SEED}]", MAX_SEED)


def unit_float(text: str) -> float:
    """A probability in (0, 1] (``--top-p``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (``--temperature``: inf would sample uniformly and be recorded as ``Infinity``, which
    is not JSON)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not (value >= 0.0 and math.isfinite(value)):  # refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (a sampling temperature)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (value > 0.0 and math.isfinite(value)):  # refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def nonempty_text(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def check_adapter(path: str | None, key: str = "adapter") -> str | None:
    """A PEFT adapter directory (:func:`foresight.adapters.read_adapter_config`); None (no adapter) passes."""
    if path is None:
        return None
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{key}: expected a peft adapter directory, got {path!r}")
    from foresight.adapters import read_adapter_config  # torch, through the fingerprint: not for every parser

    read_adapter_config(path)
    return path


def adapter_arg(text: str) -> str:
    """``--adapter DIR``: a peft adapter directory (checked before any model is loaded)."""
    try:
        check_adapter(text, "--adapter")
    except ForesightError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def device_arg(text: str) -> str:
    try:
        return check_device(text, "--device")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--device: ")) from None
