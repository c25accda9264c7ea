"""The CompactionPolicy model: one typed configuration for the CLI, the sidecar and the operator.

A policy file is YAML holding either a whole ``CompactionPolicy`` manifest (``apiVersion:
kafkacleaner.io/v1alpha1``, ``kind: CompactionPolicy``, ``metadata``, ``spec``, and the
``status`` that ``kubectl get -o yaml`` prints, which is ignored) or just its ``spec``. The
CLI reads it with ``--policy FILE``, the sidecar from the ConfigMap the operator writes, and the
operator from the custom resource itself: all three go through :func:`parse_policy`, so a
policy means the same thing everywhere.

Field names are Kafka's config names in camelCase with Kafka's defaults (``TopicRule`` mirrors
the topic-level ``LogConfig``, ``CleanerConfig`` the broker's ``log.cleaner.*``). The
``CustomResourceDefinition`` in ``crds/compactionpolicy.yaml`` is the schema of the same model;
``tests/test_crd.py`` keeps the two identical field by field (names, types, bounds, enums,
defaults) and checks that every CEL rule of the CRD is enforced here with the same verdict.

Validation follows what the Kubernetes API server does with the CRD, so that a file accepted
by the CLI is accepted by ``kubectl apply`` and the other way round:

* unknown fields are errors (``kubectl`` uses strict server-side field validation), except
  for the sidecar, which reads a file an operator one minor version newer may have written:
  it passes ``unknown_fields`` and gets them listed instead (docs/operator.md, "Version skew");
* a ``null`` value means "absent" (the API server prunes nulls of non-nullable fields before
  defaulting), so it takes the default, or is an error for a required field;
* ``true``/``false`` are not integers, and integers are not written as floats: YAML
  ``1.0e+9`` is a float and is rejected for an integer field (and ``1e9`` is a *string* in
  YAML 1.1), with a message saying how to write it;
* integer fields are ``int32`` where Kafka's config is an ``INT`` and ``int64`` where it is a
  ``LONG``, with Kafka's validators as bounds.

Errors are :class:`cleaner.errors.PolicyError` with ``field`` a dotted path from the spec
(``spec.topics[2].minCleanableDirtyRatio``) and a message that names the bad value and what is
allowed. The one check the API server cannot make is that ``match`` compiles as a *Python*
regular expression (the sidecar evaluates it with :func:`re.fullmatch`); the operator runs
:func:`parse_policy` on every reconcile and reports such errors on the resource.
"""

# RUF009: the model's fields are declared with ``_field(...)``, a thin wrapper around
# ``dataclasses.field`` that attaches the YAML key and kind; ruff cannot tell it from a call
# that builds a shared default.
# ruff: noqa: RUF009

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import enum
import fractions
import functools
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import yaml

from cleaner.errors import PolicyError
from cleaner.storage.topic_partition import METADATA_TOPIC
from cleaner.windows import CRON_PATTERN, CronError, parse_cron

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "KIND",
    "AppArmorProfile",
    "Capabilities",
    "CleanerConfig",
    "CleanupPolicy",
    "CompactConfig",
    "DataVolume",
    "FieldSpec",
    "FrozenMap",
    "Injection",
    "LabelSelector",
    "LabelSelectorRequirement",
    "Mode",
    "Policy",
    "ReportingConfig",
    "ResourceRequirements",
    "RolloutConfig",
    "RolloutStrategy",
    "SELinuxOptions",
    "SeccompProfile",
    "SecurityContext",
    "SidecarConfig",
    "StageConfig",
    "Target",
    "TopicRule",
    "load_policy",
    "parse_policy",
    "parse_policy_text",
    "spec_fields",
    "walk_model",
]

API_GROUP = "kafkacleaner.io"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "CompactionPolicy"

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

#: Smallest dedupe buffer per cleaner thread: a few dozen offset-map entries. Kafka itself only
#: insists on one entry; anything this small is a test set-up or a typo.
MIN_DEDUPE_BUFFER_PER_THREAD = 1024

_MANIFEST_KEYS = ("apiVersion", "kind", "metadata", "spec", "status")


# --------------------------------------------------------------------------------------------
# Enumerations
# --------------------------------------------------------------------------------------------


class Mode(enum.StrEnum):
    """What the sidecar (or CLI) may do to the log directories; see DESIGN.md "Operating modes"."""

    OBSERVE = "observe"
    COMPACT = "compact"
    STAGE = "stage"


class CleanupPolicy(enum.StrEnum):
    """Kafka's ``cleanup.policy`` in canonical form (sorted, lower case, no spaces)."""

    COMPACT = "compact"
    COMPACT_DELETE = "compact,delete"
    DELETE = "delete"


class RolloutStrategy(enum.StrEnum):
    """Who restarts the broker pods when the operator puts its sidecar in or takes it out.

    ``Manual`` (the default): nobody but a person or the Kafka operator; the status names the
    pods that wait. ``OnDelete``: a pod gets the change when whoever deletes it recreates it.
    ``Paced``: the operator, one broker at a time, gated on readiness and the sidecars' reports
    (docs/operator.md, "Rollouts").
    """

    MANUAL = "Manual"
    ON_DELETE = "OnDelete"
    PACED = "Paced"


class Injection(enum.StrEnum):
    """How the operator puts the sidecar into the broker pods."""

    STATEFUL_SET = "statefulSet"
    WEBHOOK = "webhook"


# --------------------------------------------------------------------------------------------
# An immutable mapping, so that the frozen model stays hashable
# --------------------------------------------------------------------------------------------

_V = TypeVar("_V")


class FrozenMap(Mapping[str, _V]):
    """A read-only, hashable ``str -> value`` mapping (label selectors, resource quantities)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, _V] | None = None) -> None:
        self._data: dict[str, _V] = dict(data or {})

    def __getitem__(self, key: str) -> _V:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


# --------------------------------------------------------------------------------------------
# Field kinds: how one YAML value is checked, converted and written back
# --------------------------------------------------------------------------------------------


def _describe(value: object) -> str:
    """A value as the user wrote it, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"{type(value).__name__} {value!r}"


def _fmt(number: float) -> str:
    return repr(number) if isinstance(number, float) and not number.is_integer() else str(int(number))


def _range_text(minimum: float | None, maximum: float | None, *, exclusive_minimum: bool = False) -> str:
    """``between 0 and 1 (inclusive)``, ``> 0 and <= 1``, ``>= 14``, ``<= 65535``."""
    if minimum is not None and maximum is not None and not exclusive_minimum:
        return f"between {_fmt(minimum)} and {_fmt(maximum)} (inclusive)"
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if exclusive_minimum else '>='} {_fmt(minimum)}")
    if maximum is not None:
        parts.append(f"<= {_fmt(maximum)}")
    return " and ".join(parts) or "any number"


class _Kind:
    """How one field's value is parsed (checked and converted) and dumped back to YAML/JSON.

    ``openapi()`` is the same constraint in the CRD's schema language (this level only: items,
    map values and object properties are kinds of their own); the CRD tests compare the two.
    """

    def parse(self, value: object, path: str) -> Any:
        raise NotImplementedError

    def dump(self, value: Any) -> Any:
        return value

    def openapi(self) -> dict[str, Any]:
        raise NotImplementedError


def _without_none(**items: Any) -> dict[str, Any]:
    return {key: value for key, value in items.items() if value is not None}


@dataclass(frozen=True)
class _Int(_Kind):
    """An integer; ``format`` is int32 for Kafka ``INT`` configs and int64 for ``LONG`` ones."""

    minimum: int | None = None
    maximum: int | None = None
    format: str = "int64"

    @property
    def bounds(self) -> tuple[int, int]:
        low, high = (INT32_MIN, INT32_MAX) if self.format == "int32" else (INT64_MIN, INT64_MAX)
        return (
            low if self.minimum is None else self.minimum,
            high if self.maximum is None else self.maximum,
        )

    def parse(self, value: object, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            hint = ""
            if isinstance(value, float) and math.isfinite(value) and value.is_integer():
                hint = f" (write {int(value)}: integer fields take no decimal point or exponent)"
            elif isinstance(value, str) and re.fullmatch(r"[-+]?[0-9_.]+([eE][-+]?[0-9]+)?", value.strip()):
                hint = " (quoted, or an exponent, which YAML reads as a string: write the plain digits)"
            raise PolicyError(path, f"must be an integer, got {_describe(value)}{hint}")
        low, high = self.bounds
        if not low <= value <= high:
            # int32 fields state their whole range (Kafka's INT); int64 ones their maximum only
            # when it is the bound that was broken.
            spelled = self.format == "int32"
            shown_low = low if self.minimum is not None or spelled or value < low else None
            shown_high = high if self.maximum is not None or spelled or value > high else None
            raise PolicyError(path, f"must be {_range_text(shown_low, shown_high)}, got {value}")
        return value

    def openapi(self) -> dict[str, Any]:
        # int32 fields spell out their maximum: the API server does not range-check formats.
        maximum = self.bounds[1] if self.format == "int32" else self.maximum
        return _without_none(type="integer", format=self.format, minimum=self.minimum, maximum=maximum)


@dataclass(frozen=True)
class _Float(_Kind):
    """A finite number (integers are accepted and converted)."""

    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False

    def parse(self, value: object, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PolicyError(path, f"must be a number, got {_describe(value)}")
        try:
            number = float(value)
        except OverflowError:  # an integer beyond a double's range
            number = math.inf
        if not math.isfinite(number):
            raise PolicyError(path, f"must be a finite number, got {value!r}")
        too_low = self.minimum is not None and (
            number <= self.minimum if self.exclusive_minimum else number < self.minimum
        )
        too_high = self.maximum is not None and number > self.maximum
        if too_low or too_high:
            allowed = _range_text(self.minimum, self.maximum, exclusive_minimum=self.exclusive_minimum)
            raise PolicyError(path, f"must be {allowed}, got {_fmt(value)}")
        return number

    def openapi(self) -> dict[str, Any]:
        return _without_none(
            type="number",
            format="double",
            minimum=self.minimum,
            exclusiveMinimum=True if self.exclusive_minimum else None,
            maximum=self.maximum,
        )


@dataclass(frozen=True)
class _Bool(_Kind):
    def parse(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            raise PolicyError(path, f"must be true or false, got {_describe(value)}")
        return value

    def openapi(self) -> dict[str, Any]:
        return {"type": "boolean"}


@dataclass(frozen=True)
class _Str(_Kind):
    """A string, optionally from an enum or matching an RE2- and Python-compatible pattern.

    ``pattern`` is anchored (``^...$``) and matched with :func:`re.fullmatch`, which is what the
    API server's (RE2) search of an anchored pattern amounts to. ``what`` says in words what the
    pattern accepts.
    """

    enum: tuple[str, ...] | None = None
    pattern: str | None = None
    what: str | None = None
    min_length: int | None = None
    max_length: int | None = None
    enum_type: type[enum.StrEnum] | None = None

    def parse(self, value: object, path: str) -> Any:
        if not isinstance(value, str):
            raise PolicyError(path, f"must be a string, got {_describe(value)}")
        if self.enum is not None and value not in self.enum:
            raise PolicyError(path, f"must be one of {', '.join(self.enum)}, got {value!r}")
        if self.min_length is not None and len(value) < self.min_length:
            raise PolicyError(
                path,
                "must not be empty"
                if self.min_length == 1
                else f"must be at least {self.min_length} characters long, got {value!r}",
            )
        if self.max_length is not None and len(value) > self.max_length:
            raise PolicyError(path, f"must be at most {self.max_length} characters long, got {len(value)}")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            what = self.what or f"a string matching {self.pattern}"
            raise PolicyError(path, f"must be {what}, got {value!r}")
        return self.enum_type(value) if self.enum_type is not None else value

    def dump(self, value: Any) -> Any:
        return str(value)

    def openapi(self) -> dict[str, Any]:
        return _without_none(
            type="string",
            enum=list(self.enum) if self.enum is not None else None,
            pattern=self.pattern,
            minLength=self.min_length,
            maxLength=self.max_length,
        )


_WORD_COMPACT = "[cC][oO][mM][pP][aA][cC][tT]"
_WORD_DELETE = "[dD][eE][lL][eE][tT][eE]"
_POLICY_WORD = f"({_WORD_COMPACT}|{_WORD_DELETE})"
#: Kafka parses ``cleanup.policy`` as a list, trimming spaces; case is ignored. The pattern is
#: written without ``(?i)`` so that every JSON-schema tool (ECMA-262 included) understands it.
CLEANUP_POLICY_PATTERN = f"^ *{_POLICY_WORD} *(, *{_POLICY_WORD} *)?$"


@dataclass(frozen=True)
class _CleanupPolicyKind(_Str):
    """``compact``, ``delete`` or both, in any case and order, with spaces: normalised."""

    pattern: str | None = CLEANUP_POLICY_PATTERN
    what: str | None = "one of compact, compact,delete, delete (Kafka's cleanup.policy; case and spaces do not matter)"
    max_length: int | None = 64

    def parse(self, value: object, path: str) -> CleanupPolicy:
        words = {word.strip().lower() for word in super().parse(value, path).split(",")}
        return CleanupPolicy(",".join(sorted(words)))


@dataclass(frozen=True)
class _RegexKind(_Str):
    """A Python regular expression, matched against the whole topic name."""

    def parse(self, value: object, path: str) -> str:
        text = super().parse(value, path)
        try:
            re.compile(text)
        except re.error as exc:
            where = f" at position {exc.pos}" if exc.pos is not None else ""
            message = f"is not a valid Python regular expression ({exc.msg}{where}): {text!r}"
            raise PolicyError(path, message) from None
        return text


#: A '..' path component (RE2- and Python-compatible; mirrored by the CRD's CEL rule).
_DOTDOT = re.compile(r"(^|/)[.][.](/|$)")


@dataclass(frozen=True)
class _RelativePathKind(_Str):
    """A path relative to the data volume's mount, without ``..`` (mirrors a CEL rule)."""

    def parse(self, value: object, path: str) -> str:
        text = super().parse(value, path)
        if text.startswith("/") or _DOTDOT.search(text):
            raise PolicyError(
                path, f"must be a path relative to target.mountPath without '..' components, got {text!r}"
            )
        return text


@dataclass(frozen=True)
class _Obj(_Kind):
    cls: type

    def parse(self, value: object, path: str) -> Any:
        return _parse_object(self.cls, value, path)

    def dump(self, value: Any) -> Any:
        return _dump_object(value)

    def openapi(self) -> dict[str, Any]:
        return {"type": "object"}


@dataclass(frozen=True)
class _List(_Kind):
    """A YAML list, held as a tuple. ``unique`` mirrors ``x-kubernetes-list-type: set``."""

    item: _Kind
    min_items: int | None = None
    max_items: int | None = None
    unique: bool = False
    #: Keys of a list of objects (``x-kubernetes-list-type: map``): no two items share them.
    map_keys: tuple[str, ...] = ()

    def parse(self, value: object, path: str) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise PolicyError(path, f"must be a list, got {_describe(value)}")
        if self.min_items is not None and len(value) < self.min_items:
            raise PolicyError(path, f"must have at least {self.min_items} item(s), got {len(value)}")
        if self.max_items is not None and len(value) > self.max_items:
            raise PolicyError(path, f"must have at most {self.max_items} items, got {len(value)}")
        items = tuple(self.item.parse(item, f"{path}[{index}]") for index, item in enumerate(value))
        if self.unique or self.map_keys:
            seen: set[Any] = set()
            for index, item in enumerate(items):
                key = tuple(item.to_dict()[k] for k in self.map_keys) if self.map_keys else item
                if key in seen:
                    if self.map_keys:
                        what = ", ".join(f"{k}={v!r}" for k, v in zip(self.map_keys, key, strict=True))
                    else:
                        what = repr(item)
                    raise PolicyError(f"{path}[{index}]", f"duplicate entry {what}")
                seen.add(key)
        return items

    def dump(self, value: Any) -> Any:
        return [self.item.dump(item) for item in value]

    def openapi(self) -> dict[str, Any]:
        return _without_none(
            type="array",
            minItems=self.min_items,
            maxItems=self.max_items,
            **{"x-kubernetes-list-type": "map" if self.map_keys else "set" if self.unique else None,
               "x-kubernetes-list-map-keys": list(self.map_keys) or None},
        )


@dataclass(frozen=True)
class _Map(_Kind):
    """A ``str -> value`` mapping with typed values (never a free-form object)."""

    value: _Kind
    max_properties: int | None = None

    def parse(self, value: object, path: str) -> FrozenMap[Any]:
        if not isinstance(value, Mapping):
            raise PolicyError(path, f"must be a mapping, got {_describe(value)}")
        if self.max_properties is not None and len(value) > self.max_properties:
            raise PolicyError(path, f"must have at most {self.max_properties} entries, got {len(value)}")
        result = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise PolicyError(path, f"keys must be strings, got {_describe(key)}")
            result[key] = self.value.parse(item, f"{path}.{key}")
        return FrozenMap(result)

    def dump(self, value: Any) -> Any:
        return {key: self.value.dump(item) for key, item in value.items()}

    def openapi(self) -> dict[str, Any]:
        return _without_none(type="object", maxProperties=self.max_properties)


#: Kubernetes' resource.Quantity syntax (``500m``, ``256Mi``, ``1.5``, ``1e3``), without a minus
#: sign: a container's requests and limits must not be negative (the API server refuses the pod).
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(value: str | int) -> fractions.Fraction:
    """The exact value of a Kubernetes quantity (``250m`` is 1/4, ``1Ki`` 1024, ``1e3`` 1000),
    for comparisons such as requests against limits. Raises ValueError on anything else."""
    text = str(value).strip()
    match = re.fullmatch(r"([+-]?(?:(?:[0-9]+(?:\.[0-9]*)?)|(?:\.[0-9]+)))(.*)", text)
    if match is None:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = fractions.Fraction(match.group(1)), match.group(2)
    if suffix in _BINARY_SUFFIXES:
        return number * _BINARY_SUFFIXES[suffix]
    if suffix in _DECIMAL_SUFFIXES:
        return number * fractions.Fraction(10) ** _DECIMAL_SUFFIXES[suffix]
    exponent = re.fullmatch(r"[eE]([+-]?(?:(?:[0-9]+(?:\.[0-9]*)?)|(?:\.[0-9]+)))", suffix)
    if exponent is None or not float(exponent.group(1)).is_integer():
        raise ValueError(f"not a quantity: {value!r}")
    return number * fractions.Fraction(10) ** int(float(exponent.group(1)))


@dataclass(frozen=True)
class _Quantity(_Kind):
    """A Kubernetes quantity: an integer or a string (``x-kubernetes-int-or-string``); kept as str."""

    def parse(self, value: object, path: str) -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str) and re.fullmatch(QUANTITY_PATTERN, value):
            return value
        raise PolicyError(path, f"must be a Kubernetes quantity such as 500m, 256Mi or 2 (not negative), got "
                          f"{_describe(value)}")

    def openapi(self) -> dict[str, Any]:
        return {"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}


# --------------------------------------------------------------------------------------------
# Declaring fields, and the generic walk that parses and dumps them
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldSpec:
    """What a model field looks like in YAML: its camelCase key, kind and Kafka counterpart.

    Public so that tests (and tools) can walk the model: ``dataclasses.fields(cls)`` gives each
    field, ``field.metadata["spec"]`` this object.
    """

    key: str
    kind: _Kind
    kafka: str | None = None
    required: bool = False
    omit_empty: bool = False
    nullable: bool = False


_NO_DEFAULT: Any = dataclasses.MISSING


def _field(
    key: str,
    kind: _Kind,
    default: Any = _NO_DEFAULT,
    *,
    kafka: str | None = None,
    omit_empty: bool = False,
    nullable: bool = False,
) -> Any:
    spec = FieldSpec(key, kind, kafka=kafka, required=default is _NO_DEFAULT, omit_empty=omit_empty, nullable=nullable)
    return field(default=default, metadata={"spec": spec})


@functools.cache
def spec_fields(cls: type) -> tuple[tuple[dataclasses.Field[Any], FieldSpec], ...]:
    """The YAML-visible fields of a model class, in declaration order."""
    return tuple((f, f.metadata["spec"]) for f in dataclasses.fields(cls) if "spec" in f.metadata)


class _Model:
    """Base of the model classes: cross-field checks and the camelCase dump."""

    def _check(self, path: str) -> None:
        """Cross-field checks (each mirrors a CEL rule of the CRD). ``path`` is this object's."""

    def to_dict(self) -> dict[str, Any]:
        """This object as the camelCase mapping of the CRD, defaults filled, ``None`` left out."""
        return _dump_object(self)


_M = TypeVar("_M", bound=_Model)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


_UNKNOWN_FIELDS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("unknown_fields", default=None)
"""Where the parse in progress lists unknown fields; None: they are errors (the default)."""


def _unknown_field(path: str, key: object, allowed: list[str]) -> None:
    """An unknown field: listed when the caller collects them (the sidecar), else an error."""
    collected = _UNKNOWN_FIELDS.get()
    if collected is None:
        raise PolicyError(_join(path, str(key)), _unknown_field_message(key, allowed))
    collected.append(_join(path, str(key)))


def _parse_object(cls: type[_M], value: object, path: str) -> _M:
    if not isinstance(value, Mapping):
        raise PolicyError(path, f"must be a mapping, got {_describe(value)}")
    by_key = {spec.key: (f, spec) for f, spec in spec_fields(cls)}
    for key in value:
        if key not in by_key:
            _unknown_field(path, key, list(by_key))
    # Null is absent: the API server prunes nulls of non-nullable fields before defaulting.
    for key, (_f, spec) in by_key.items():
        if spec.required and value.get(key) is None:
            raise PolicyError(_join(path, key), "is required")
    kwargs: dict[str, Any] = {}
    for key, (f, spec) in by_key.items():
        raw = value.get(key)
        if raw is not None:
            kwargs[f.name] = spec.kind.parse(raw, _join(path, key))
    obj = cls(**kwargs)
    obj._check(path)
    return obj


def _unknown_field_message(key: object, allowed: list[str]) -> str:
    close = difflib.get_close_matches(str(key), allowed, n=1) if isinstance(key, str) else []
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown field {key!r} ({hint}allowed: {', '.join(allowed)})"


def _dump_object(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f, spec in spec_fields(type(obj)):
        value = getattr(obj, f.name)
        if value is None or (spec.omit_empty and not value):
            continue
        out[spec.key] = spec.kind.dump(value)
    return out


# --------------------------------------------------------------------------------------------
# The model: topic rules and the broker's cleaner settings
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TopicRule(_Model):
    """Topic-level configs for the topics whose whole name matches ``match`` (Kafka's LogConfig).

    The defaults are Kafka's topic defaults. ``cleanup_policy`` defaults to Kafka's ``delete``
    too: a rule is compacted only when it says ``compact``, as a Kafka topic is, so a rule
    that forgets the field never loses a record to compaction.
    """

    match: str = _field("match", _RegexKind(min_length=1, max_length=1024))
    cleanup_policy: CleanupPolicy = _field(
        "cleanupPolicy", _CleanupPolicyKind(), CleanupPolicy.DELETE, kafka="cleanup.policy"
    )
    min_cleanable_dirty_ratio: float = _field(
        "minCleanableDirtyRatio", _Float(0.0, 1.0), 0.5, kafka="min.cleanable.dirty.ratio"
    )
    delete_retention_ms: int = _field("deleteRetentionMs", _Int(0), 86_400_000, kafka="delete.retention.ms")
    min_compaction_lag_ms: int = _field("minCompactionLagMs", _Int(0), 0, kafka="min.compaction.lag.ms")
    max_compaction_lag_ms: int = _field("maxCompactionLagMs", _Int(1), INT64_MAX, kafka="max.compaction.lag.ms")
    #: Kafka 3.x's minimum (LegacyRecord.RECORD_OVERHEAD_V0 = 14 bytes), not Kafka 4.0's 1 MiB
    #: (KIP-1030): engine tests and small offline copies use KiB-sized segments.
    segment_bytes: int = _field("segmentBytes", _Int(14, format="int32"), 1_073_741_824, kafka="segment.bytes")
    segment_index_bytes: int = _field(
        "segmentIndexBytes", _Int(4, format="int32"), 10_485_760, kafka="segment.index.bytes"
    )
    index_interval_bytes: int = _field(
        "indexIntervalBytes", _Int(0, format="int32"), 4096, kafka="index.interval.bytes"
    )
    max_message_bytes: int = _field("maxMessageBytes", _Int(0, format="int32"), 1_048_588, kafka="max.message.bytes")
    retention_ms: int = _field("retentionMs", _Int(-1), 604_800_000, kafka="retention.ms")
    #: Kafka accepts any negative value; -1 is the only one that means something (unlimited).
    retention_bytes: int = _field("retentionBytes", _Int(-1), -1, kafka="retention.bytes")
    per_partition_metrics: bool = _field("perPartitionMetrics", _Bool(), False)
    #: How long a superseded record (or a tombstone past its delete horizon) may stay on disk
    #: before the partition is in breach (``cleaner.deletion``); None: ``maxCompactionLagMs``
    #: when that is set (below Kafka's Long.MAX_VALUE default), else no deadline.
    deletion_deadline_ms: int | None = _field("deletionDeadlineMs", _Int(1), None)

    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", re.compile(self.match))

    @property
    def compact(self) -> bool:
        """``cleanup.policy`` contains ``compact`` (Kafka: ``LogConfig.compact``)."""
        return self.cleanup_policy in (CleanupPolicy.COMPACT, CleanupPolicy.COMPACT_DELETE)

    @property
    def delete(self) -> bool:
        """``cleanup.policy`` contains ``delete`` (Kafka: ``LogConfig.delete``)."""
        return self.cleanup_policy in (CleanupPolicy.DELETE, CleanupPolicy.COMPACT_DELETE)

    @property
    def effective_deletion_deadline_ms(self) -> int | None:
        """``deletionDeadlineMs``, else ``max.compaction.lag.ms`` when set, else None (no deadline)."""
        if self.deletion_deadline_ms is not None:
            return self.deletion_deadline_ms
        return self.max_compaction_lag_ms if self.max_compaction_lag_ms < INT64_MAX else None

    def matches(self, topic: str) -> bool:
        """Whether the *whole* topic name matches (``orders`` does not match ``order``)."""
        return self.pattern.fullmatch(topic) is not None

    def _check(self, path: str) -> None:
        # CEL: self.minCompactionLagMs <= self.maxCompactionLagMs
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms:
            raise PolicyError(
                f"{path}.minCompactionLagMs",
                f"must be <= maxCompactionLagMs ({self.max_compaction_lag_ms}), got {self.min_compaction_lag_ms}",
            )


@dataclass(frozen=True, kw_only=True)
class CleanerConfig(_Model):
    """The broker's ``log.cleaner.*`` settings (Kafka's CleanerConfig), one set per sidecar/CLI run."""

    #: Kafka accepts 0 (no cleaner at all); here a cleaner that never cleans is ``mode: observe``.
    threads: int = _field("threads", _Int(1, format="int32"), 1, kafka="log.cleaner.threads")
    dedupe_buffer_size: int = _field(
        "dedupeBufferSize",
        _Int(MIN_DEDUPE_BUFFER_PER_THREAD),
        134_217_728,
        kafka="log.cleaner.dedupe.buffer.size",
    )
    #: Kafka has no validator; (0, 1] is the range in which an offset map works at all.
    dedupe_buffer_load_factor: float = _field(
        "dedupeBufferLoadFactor",
        _Float(0.0, 1.0, exclusive_minimum=True),
        0.9,
        kafka="log.cleaner.io.buffer.load.factor",
    )
    io_buffer_size: int = _field("ioBufferSize", _Int(0, format="int32"), 524_288, kafka="log.cleaner.io.buffer.size")
    #: None (null) is Kafka's Double.MAX_VALUE default: no throttling.
    max_io_bytes_per_second: float | None = _field(
        "maxIoBytesPerSecond",
        _Float(0.0, exclusive_minimum=True),
        None,
        kafka="log.cleaner.io.max.bytes.per.second",
        nullable=True,
    )
    backoff_ms: int = _field("backoffMs", _Int(0), 15_000, kafka="log.cleaner.backoff.ms")
    producer_id_expiration_ms: int = _field(
        "producerIdExpirationMs",
        _Int(1, format="int32"),
        86_400_000,
        kafka="producer.id.expiration.ms",
    )

    @property
    def dedupe_buffer_per_thread(self) -> int:
        """Offset-map memory of one thread: Kafka's ``min(dedupeBufferSize / threads, Int.MaxValue)``."""
        return min(self.dedupe_buffer_size // self.threads, INT32_MAX)

    @property
    def io_buffer_per_thread(self) -> int:
        """Size of each of a thread's read and write buffers: ``ioBufferSize / threads / 2``."""
        return self.io_buffer_size // self.threads // 2

    def _check(self, path: str) -> None:
        # CEL: self.dedupeBufferSize >= self.threads * 1024
        needed = self.threads * MIN_DEDUPE_BUFFER_PER_THREAD
        if self.dedupe_buffer_size < needed:
            raise PolicyError(
                f"{path}.dedupeBufferSize",
                f"must be at least {MIN_DEDUPE_BUFFER_PER_THREAD} bytes per cleaner thread "
                f"(>= {needed} for {self.threads} threads), got {self.dedupe_buffer_size}",
            )


@dataclass(frozen=True, kw_only=True)
class StageConfig(_Model):
    """Settings of ``mode: stage``: sets staged next to the live broker, committed only
    while the broker is stopped (the pod's start-up gate, the pod's termination)."""

    #: Staging stops while free disk space would drop below this share of the volume, and
    #: when free space falls below it the largest staged sets are deleted first.
    min_free_disk_ratio: float = _field("minFreeDiskRatio", _Float(0.0, 1.0), 0.2)
    #: The longest a commit may hold the broker back (the start-up gate) or the pod's
    #: termination; sets not reached by then stay staged. 0: never commit.
    max_commit_seconds: int = _field("maxCommitSeconds", _Int(0, 3600, format="int32"), 60)


@dataclass(frozen=True)
class _CronKind(_Str):
    """A maintenance window: a Quartz cron expression (``cleaner.windows``)."""

    pattern: str | None = CRON_PATTERN
    what: str | None = "a Quartz cron expression of 6 or 7 fields (as Strimzi's maintenanceTimeWindows)"
    max_length: int | None = 256

    def parse(self, value: object, path: str) -> str:
        text = super().parse(value, path)
        try:
            parse_cron(text)
        except CronError as exc:
            raise PolicyError(path, f"is not a supported cron expression ({exc}): {text!r}") from None
        return text


@dataclass(frozen=True, kw_only=True)
class CompactConfig(_Model):
    """Settings of ``mode: compact`` in a pod, where the broker normally runs: the sidecar
    holds a log dir's ``.lock`` only in the start-up gate (before the broker starts) and
    inside a maintenance window."""

    #: When the sidecar may take a free ``.lock`` after the gate (UTC). Empty: never.
    windows: tuple[str, ...] = _field("windows", _List(_CronKind(), max_items=16), ())
    #: The longest the start-up gate compacts before the broker may start. 0: the gate
    #: does not compact.
    max_gate_seconds: int = _field("maxGateSeconds", _Int(0, 3600, format="int32"), 60)


# --------------------------------------------------------------------------------------------
# The Kubernetes-only parts (the engine ignores them; the operator acts on them)
# --------------------------------------------------------------------------------------------

DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"

_OBJECT_NAME = _Str(max_length=253, pattern=DNS1123_SUBDOMAIN, what="a Kubernetes object name (DNS-1123 subdomain)")
#: What the operator itself puts into the sidecar container (operator/injection.py): the policy
#: ConfigMap's volume, mounted at the policy dir and (to keep the pod's ServiceAccount token
#: out) at the token dir; and where the image keeps the program. A data volume of that name, or
#: mounted at, under or above one of those paths, makes a pod the API server refuses (the same
#: mount path twice) or a sidecar that cannot start (a mount inside a read-only ConfigMap
#: mount, the program hidden): the CRD's CEL rules and the model refuse such a policy.
SIDECAR_POLICY_VOLUME = "kafka-cleaner-policy"
SIDECAR_POLICY_DIR = "/etc/kafka-cleaner"
SIDECAR_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SIDECAR_PROGRAM_DIR = "/opt/kafka-cleaner"
RESERVED_MOUNT_PATHS = (SIDECAR_POLICY_DIR, SIDECAR_PROGRAM_DIR, SIDECAR_TOKEN_DIR)
#: An absolute path in its normal form (no ``//``, ``.`` or ``..`` component, no trailing
#: ``/``), so that equal paths are equal strings, for the API server's uniqueness check of
#: mount paths and for the rules below.
MOUNT_PATH_PATTERN = r"^(/([^/.][^/]*|[.][^/.][^/]*|[.][.][^/]+))+$"


@dataclass(frozen=True)
class _DataVolumeNameKind(_Str):
    """A pod volume name other than the sidecar's own (mirrors a CEL rule)."""

    def parse(self, value: object, path: str) -> str:
        text = super().parse(value, path)
        # CEL: self != 'kafka-cleaner-policy'
        if text == SIDECAR_POLICY_VOLUME:
            raise PolicyError(path, f"{text!r} is the sidecar's own policy volume, not a data volume")
        return text


@dataclass(frozen=True)
class _MountPathKind(_Str):
    """Where the sidecar mounts a data volume: a normalised absolute path, not at, under or
    above one of :data:`RESERVED_MOUNT_PATHS` (mirrors a CEL rule)."""

    def parse(self, value: object, path: str) -> str:
        text = super().parse(value, path)
        # CEL: for each reserved r: self != r && !self.startsWith(r + '/') && !r.startsWith(self + '/')
        for reserved in RESERVED_MOUNT_PATHS:
            if text == reserved or text.startswith(reserved + "/") or reserved.startswith(text + "/"):
                raise PolicyError(path, f"{text!r} is, contains or lies inside {reserved}, which the sidecar "
                                  f"needs for itself (reserved: {', '.join(RESERVED_MOUNT_PATHS)})")
        return text


_VOLUME_NAME = _DataVolumeNameKind(max_length=63, pattern=DNS1123_LABEL, what="a pod volume name (DNS-1123 label)")
_MOUNT_PATH = _MountPathKind(max_length=1024, pattern=MOUNT_PATH_PATTERN,
                             what="an absolute path other than /, without '//', '.' or '..' components or a "
                                  "trailing '/'")
_LOG_DIRS = _List(_RelativePathKind(min_length=1, max_length=255), min_items=1, max_items=16, unique=True)
_LABEL_VALUE = _Str(max_length=63, pattern=LABEL_VALUE, what="a label value")


@dataclass(frozen=True, kw_only=True)
class LabelSelectorRequirement(_Model):
    """One ``matchExpressions`` entry of a Kubernetes label selector."""

    key: str = _field("key", _Str(min_length=1, max_length=317))
    operator: str = _field("operator", _Str(enum=("In", "NotIn", "Exists", "DoesNotExist")))
    values: tuple[str, ...] = _field("values", _List(_Str(max_length=63), max_items=256), (), omit_empty=True)

    def _check(self, path: str) -> None:
        # CEL: (self.operator == 'In' || self.operator == 'NotIn')
        #      == (has(self.values) && size(self.values) > 0)
        if (self.operator in ("In", "NotIn")) != bool(self.values):
            need = "must not be empty" if self.operator in ("In", "NotIn") else "must be empty"
            raise PolicyError(f"{path}.values", f"{need} for operator {self.operator}")


@dataclass(frozen=True, kw_only=True)
class LabelSelector(_Model):
    """A Kubernetes label selector (``metav1.LabelSelector``); it must select something."""

    match_labels: FrozenMap[str] = _field(
        "matchLabels", _Map(_LABEL_VALUE, max_properties=64), FrozenMap(), omit_empty=True
    )
    match_expressions: tuple[LabelSelectorRequirement, ...] = _field(
        "matchExpressions", _List(_Obj(LabelSelectorRequirement), max_items=32), (), omit_empty=True
    )

    def _check(self, path: str) -> None:
        # CEL: (has(self.matchLabels) && size(self.matchLabels) > 0)
        #      || (has(self.matchExpressions) && size(self.matchExpressions) > 0)
        if not self.match_labels and not self.match_expressions:
            raise PolicyError(path, "must not be empty: an empty selector would select every pod in the namespace")


@dataclass(frozen=True, kw_only=True)
class DataVolume(_Model):
    """One more data volume of a JBOD broker (``log.dirs`` over several disks)."""

    name: str = _field("name", _VOLUME_NAME)
    mount_path: str = _field("mountPath", _MOUNT_PATH)


@dataclass(frozen=True, kw_only=True)
class Target(_Model):
    """Which broker pods get the sidecar, and where their Kafka log directories are.

    ``injection`` unset means ``statefulSet`` when ``statefulSet`` is given, else ``webhook``
    (see :attr:`effective_injection`). ``logDirs`` are relative to ``mountPath`` and may use
    shell wildcards (``kafka-log*``: Strimzi names a broker's log dir after its node id).
    """

    stateful_set: str | None = _field("statefulSet", _OBJECT_NAME, None)
    pod_selector: LabelSelector | None = _field("podSelector", _Obj(LabelSelector), None)
    data_volume: str = _field("dataVolume", _VOLUME_NAME)
    mount_path: str = _field("mountPath", _MOUNT_PATH)
    log_dirs: tuple[str, ...] = _field("logDirs", _LOG_DIRS)
    #: JBOD: the broker's other data volumes; ``logDirs`` are looked for under each mount too.
    additional_data_volumes: tuple[DataVolume, ...] = _field(
        "additionalDataVolumes", _List(_Obj(DataVolume), max_items=15, map_keys=("name",)), (), omit_empty=True
    )
    injection: Injection | None = _field("injection", _Str(enum=tuple(Injection), enum_type=Injection), None)

    @property
    def data_volumes(self) -> tuple[tuple[str, str], ...]:
        """(volume, mount path) of every data volume: ``dataVolume`` first, then the others."""
        return ((self.data_volume, self.mount_path),
                *((v.name, v.mount_path) for v in self.additional_data_volumes))

    @property
    def effective_injection(self) -> Injection:
        """The injection the operator uses: the explicit one, else derived from the target kind."""
        if self.injection is not None:
            return self.injection
        return Injection.STATEFUL_SET if self.stateful_set is not None else Injection.WEBHOOK

    def _check(self, path: str) -> None:
        # CEL: has(self.statefulSet) != has(self.podSelector)
        if (self.stateful_set is None) == (self.pod_selector is None):
            got = "both" if self.stateful_set is not None else "neither"
            raise PolicyError(path, f"exactly one of statefulSet or podSelector must be set, got {got}")
        # CEL: !has(self.additionalDataVolumes) || self.additionalDataVolumes.all(v, v.name != self.dataVolume
        #      && v.mountPath != self.mountPath)
        for index, volume in enumerate(self.additional_data_volumes):
            if volume.name == self.data_volume or volume.mount_path == self.mount_path:
                raise PolicyError(
                    f"{path}.additionalDataVolumes",
                    f"entry {index} ({volume.name} at {volume.mount_path}) repeats dataVolume or mountPath: "
                    "each data volume once, each at its own path",
                )
        # CEL on additionalDataVolumes: self.all(v, self.exists_one(w, w.mountPath == v.mountPath))
        seen: dict[str, int] = {}
        for index, volume in enumerate(self.additional_data_volumes):
            if volume.mount_path in seen:
                raise PolicyError(
                    f"{path}.additionalDataVolumes",
                    f"entries {seen[volume.mount_path]} and {index} are both mounted at {volume.mount_path}: each "
                    "data volume at its own path (a pod mounting two volumes at one path is refused)",
                )
            seen[volume.mount_path] = index
        # CEL: !has(self.injection) || self.injection != 'statefulSet' || has(self.statefulSet)
        if self.injection is Injection.STATEFUL_SET and self.stateful_set is None:
            raise PolicyError(
                f"{path}.injection",
                "statefulSet injection needs target.statefulSet (a podSelector has no StatefulSet "
                "to patch: use webhook)",
            )


_QUANTITIES = _Map(_Quantity(), max_properties=16)


@dataclass(frozen=True, kw_only=True)
class ResourceRequirements(_Model):
    """Container resources (``limits`` and ``requests`` of Kubernetes quantities)."""

    limits: FrozenMap[str] = _field("limits", _QUANTITIES, FrozenMap(), omit_empty=True)
    requests: FrozenMap[str] = _field("requests", _QUANTITIES, FrozenMap(), omit_empty=True)

    def _check(self, path: str) -> None:
        # Not a CEL rule: CEL's quantity() is not available to new CRDs on Kubernetes 1.28,
        # which the chart supports. The operator parses every policy before it injects (the
        # webhook skips an invalid one, a round reports InvalidSpec), so such a policy never
        # yields a pod the API server refuses (a request above its limit).
        for name, request in self.requests.items():
            limit = self.limits.get(name)
            if limit is not None and parse_quantity(request) > parse_quantity(limit):
                raise PolicyError(f"{path}.requests.{name}", f"{request} is above the limit {limit}: the API server "
                                  "refuses a container whose request exceeds its limit")


_CAPABILITY_LIST = _List(_Str(max_length=64), max_items=64)


#: Pod Security "restricted" lets a container add this capability and no other.
ALLOWED_CAPABILITY = "NET_BIND_SERVICE"
#: The SELinux types Pod Security "baseline" (and so "restricted") allows ('' is unset).
ALLOWED_SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t")
_RESTRICTED = "(Pod Security restricted)"


@dataclass(frozen=True, kw_only=True)
class Capabilities(_Model):
    add: tuple[str, ...] = _field("add", _CAPABILITY_LIST, (), omit_empty=True)
    drop: tuple[str, ...] = _field("drop", _CAPABILITY_LIST, (), omit_empty=True)

    def _check(self, path: str) -> None:
        # CEL on add[]: self == 'NET_BIND_SERVICE'
        for index, capability in enumerate(self.add):
            if capability != ALLOWED_CAPABILITY:
                raise PolicyError(f"{path}.add[{index}]", f"{capability!r}: only {ALLOWED_CAPABILITY} may be "
                                  f"added {_RESTRICTED}")
        # CEL on drop: size(self) == 0 || 'ALL' in self (an empty drop is left out, so the
        # default [ALL] stays; any other list replaces it)
        if self.drop and "ALL" not in self.drop:
            raise PolicyError(f"{path}.drop", f"must contain ALL {_RESTRICTED}; it replaces the default [ALL]")


_PROFILE_TYPE = _Str(enum=("RuntimeDefault", "Unconfined", "Localhost"))
_SHORT = _Str(max_length=256)
_PROFILE_PATH = _Str(max_length=4096)


@dataclass(frozen=True, kw_only=True)
class SeccompProfile(_Model):
    type: str = _field("type", _PROFILE_TYPE)
    localhost_profile: str | None = _field("localhostProfile", _PROFILE_PATH, None)

    def _check(self, path: str) -> None:
        # CEL on type: self != 'Unconfined'
        if self.type == "Unconfined":
            raise PolicyError(f"{path}.type", f"must not be Unconfined {_RESTRICTED}")


@dataclass(frozen=True, kw_only=True)
class AppArmorProfile(_Model):
    type: str = _field("type", _PROFILE_TYPE)
    localhost_profile: str | None = _field("localhostProfile", _PROFILE_PATH, None)

    def _check(self, path: str) -> None:
        # CEL on type: self != 'Unconfined'
        if self.type == "Unconfined":
            raise PolicyError(f"{path}.type", f"must not be Unconfined {_RESTRICTED}")


@dataclass(frozen=True, kw_only=True)
class SELinuxOptions(_Model):
    user: str | None = _field("user", _SHORT, None)
    role: str | None = _field("role", _SHORT, None)
    type: str | None = _field("type", _SHORT, None)
    level: str | None = _field("level", _SHORT, None)

    def _check(self, path: str) -> None:
        # CEL on user and role: self == ''
        for name, value in (("user", self.user), ("role", self.role)):
            if value:
                raise PolicyError(f"{path}.{name}", f"must not be set {_RESTRICTED}")
        # CEL on type: self in ['', 'container_t', 'container_init_t', 'container_kvm_t']
        if self.type is not None and self.type not in ALLOWED_SELINUX_TYPES:
            raise PolicyError(f"{path}.type", f"{self.type!r} must be container_t, container_init_t or "
                              f"container_kvm_t {_RESTRICTED}")


@dataclass(frozen=True, kw_only=True)
class SecurityContext(_Model):
    """The sidecar container's extra securityContext: Kubernetes' core/v1 SecurityContext, typed.

    Every Linux field of the core type is here (``windowsOptions`` is left out: the image is
    Linux-only), so the CRD needs no free-form object. The operator merges it over its
    restricted defaults; ``runAsUser``/``runAsGroup`` are what compact and stage modes
    usually need, to write files owned by the broker's user.
    """

    allow_privilege_escalation: bool | None = _field("allowPrivilegeEscalation", _Bool(), None)
    app_armor_profile: AppArmorProfile | None = _field("appArmorProfile", _Obj(AppArmorProfile), None)
    capabilities: Capabilities | None = _field("capabilities", _Obj(Capabilities), None)
    privileged: bool | None = _field("privileged", _Bool(), None)
    proc_mount: str | None = _field("procMount", _Str(enum=("Default", "Unmasked")), None)
    read_only_root_filesystem: bool | None = _field("readOnlyRootFilesystem", _Bool(), None)
    run_as_group: int | None = _field("runAsGroup", _Int(0), None)
    run_as_non_root: bool | None = _field("runAsNonRoot", _Bool(), None)
    run_as_user: int | None = _field("runAsUser", _Int(0), None)
    se_linux_options: SELinuxOptions | None = _field("seLinuxOptions", _Obj(SELinuxOptions), None)
    seccomp_profile: SeccompProfile | None = _field("seccompProfile", _Obj(SeccompProfile), None)

    def _check(self, path: str) -> None:
        """Pod Security "restricted", as the CRD's CEL rules hold it: whoever may write a policy
        gets no more privileged container into a broker pod than that profile allows."""
        # CEL on allowPrivilegeEscalation and privileged: !self
        for name, value in (("allowPrivilegeEscalation", self.allow_privilege_escalation),
                            ("privileged", self.privileged)):
            if value:
                raise PolicyError(f"{path}.{name}", f"must not be true {_RESTRICTED}")
        # CEL on procMount: self == 'Default'
        if self.proc_mount is not None and self.proc_mount != "Default":
            raise PolicyError(f"{path}.procMount", f"must be Default {_RESTRICTED}")
        # CEL on runAsNonRoot: self
        if self.run_as_non_root is False:
            raise PolicyError(f"{path}.runAsNonRoot", f"must not be false {_RESTRICTED}")
        # CEL on runAsUser: self != 0
        if self.run_as_user == 0:
            raise PolicyError(f"{path}.runAsUser", f"must not be 0, root {_RESTRICTED}")


#: 9404 is taken by the JMX exporter in common Kafka deployments.
DEFAULT_SIDECAR_PORT = 9410


@dataclass(frozen=True, kw_only=True)
class SidecarConfig(_Model):
    """The injected container. ``image`` unset: the operator's own image (one image for both)."""

    image: str | None = _field("image", _Str(min_length=1, max_length=1024), None)
    #: Secrets (in the broker's namespace) to pull ``image`` with, added to the broker pod's own
    #: ``imagePullSecrets``: the chart's ``imagePullSecrets`` reach only the operator's pod.
    image_pull_secrets: tuple[str, ...] = _field(
        "imagePullSecrets", _List(_OBJECT_NAME, max_items=16, unique=True), (), omit_empty=True
    )
    resources: ResourceRequirements | None = _field("resources", _Obj(ResourceRequirements), None)
    port: int = _field("port", _Int(1, 65535, format="int32"), DEFAULT_SIDECAR_PORT)
    security_context: SecurityContext | None = _field("securityContext", _Obj(SecurityContext), None)

    @property
    def memory_limit(self) -> str | None:
        """The container's memory limit as injected: :data:`DEFAULT_SIDECAR_MEMORY` when
        ``resources`` is unset; None when resources are set without a memory limit."""
        if self.resources is None:
            return DEFAULT_SIDECAR_MEMORY
        return self.resources.limits.get("memory")


#: The sidecar's memory request and limit when ``sidecar.resources`` is unset.
DEFAULT_SIDECAR_MEMORY = "512Mi"
MIB = 2**20
#: What a cleaning sidecar needs besides its offset map: the Python process with its libraries,
#: the scan's buffers and the HTTP server (a clean with a 1 MiB map peaked at 82 MB RSS, one with
#: the default 128 MiB map at 212 MB: ``/usr/bin/time -v kafka-cleaner clean``), with room.
SIDECAR_MEMORY_BASELINE = 160 * MIB
#: Per cleaner thread: its read and write buffers (``ioBufferSize``, a batch larger than that
#: gets a buffer of its own) and its share of the segment being written.
SIDECAR_MEMORY_PER_THREAD = 32 * MIB


def sidecar_memory_needed(cleaner: CleanerConfig) -> int:
    """The least memory limit a compact- or stage-mode sidecar runs ``cleaner`` in."""
    return cleaner.dedupe_buffer_size + SIDECAR_MEMORY_BASELINE + SIDECAR_MEMORY_PER_THREAD * cleaner.threads


@dataclass(frozen=True, kw_only=True)
class ReportingConfig(_Model):
    """What the sidecar reports and how often the operator pulls it (status stays bounded)."""

    #: The operator marks a broker stale after 3 missed intervals: an hour bounds that at 3 h.
    interval_seconds: int = _field("intervalSeconds", _Int(1, 3600, format="int32"), 30)
    #: status.topPartitions holds at most 200 entries.
    top_partitions: int = _field("topPartitions", _Int(1, 200, format="int32"), 20)
    max_partition_series: int = _field("maxPartitionSeries", _Int(0, format="int32"), 1000)
    #: A partition's deletion facts (``cleaner.deletion``) read every record of its log: at most
    #: this often, and only when its segments changed.
    deletion_interval_seconds: int = _field("deletionIntervalSeconds", _Int(1, 86400, format="int32"), 300)


@dataclass(frozen=True, kw_only=True)
class RolloutConfig(_Model):
    """How a change of the injected sidecar reaches the broker pods (no pod restarts by itself
    unless ``strategy`` is ``Paced``)."""

    strategy: RolloutStrategy = _field("strategy", _Str(enum=tuple(RolloutStrategy), enum_type=RolloutStrategy),
                                       RolloutStrategy.MANUAL)
    #: A pod the operator restarted that is not Ready (or not reporting) within this makes the
    #: rollout Stalled; a stall caused by the sidecar removes it from the pod template again.
    progress_deadline_seconds: int = _field("progressDeadlineSeconds", _Int(1, 86400, format="int32"), 600)


# --------------------------------------------------------------------------------------------
# The policy
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Policy(_Model):
    """A CompactionPolicy's spec, plus the manifest's name and generation when there was one.

    Two policies are equal when their specs are (``name``, ``namespace`` and
    ``policy_generation`` do not take part), so the operator can compare the desired policy with
    the one in the sidecar's ConfigMap.
    """

    mode: Mode = _field("mode", _Str(enum=tuple(Mode), enum_type=Mode), Mode.OBSERVE)
    topics: tuple[TopicRule, ...] = _field("topics", _List(_Obj(TopicRule), max_items=256), ())
    cleaner: CleanerConfig = _field("cleaner", _Obj(CleanerConfig), CleanerConfig())
    stage: StageConfig = _field("stage", _Obj(StageConfig), StageConfig())
    compact: CompactConfig = _field("compact", _Obj(CompactConfig), CompactConfig())
    target: Target | None = _field("target", _Obj(Target), None)
    sidecar: SidecarConfig = _field("sidecar", _Obj(SidecarConfig), SidecarConfig())
    reporting: ReportingConfig = _field("reporting", _Obj(ReportingConfig), ReportingConfig())
    rollout: RolloutConfig = _field("rollout", _Obj(RolloutConfig), RolloutConfig())
    paused: bool = _field("paused", _Bool(), False)

    name: str | None = field(default=None, compare=False)
    namespace: str | None = field(default=None, compare=False)
    #: ``metadata.generation`` of the manifest this came from (None for a bare spec): the sidecar
    #: reports it as ``policyGeneration`` so the operator knows which spec a report reflects.
    policy_generation: int | None = field(default=None, compare=False)

    def rule_for(self, topic: str) -> TopicRule | None:
        """The first rule whose ``match`` matches the whole topic name; None: never touch it.
        ``__cluster_metadata`` matches no rule, whatever its regex (Kafka's LogManager does
        not manage the metadata log either)."""
        if topic == METADATA_TOPIC:
            return None
        for rule in self.topics:
            if rule.pattern.fullmatch(topic) is not None:
                return rule
        return None

    def to_spec_dict(self) -> dict[str, Any]:
        """The canonical spec (camelCase, defaults filled, unset optional fields left out).

        ``parse_policy(p.to_spec_dict()) == p`` for every policy.
        """
        return self.to_dict()

    def to_manifest(self) -> dict[str, Any]:
        """A whole CompactionPolicy manifest (what the operator writes for the sidecar)."""
        metadata: dict[str, Any] = {}
        if self.name is not None:
            metadata["name"] = self.name
        if self.namespace is not None:
            metadata["namespace"] = self.namespace
        if self.policy_generation is not None:
            metadata["generation"] = self.policy_generation
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": self.to_spec_dict()}

    def _check(self, path: str) -> None:
        # CEL: self.mode != 'stage' || !has(self.target) || has(self.target.injection)
        if self.mode is Mode.STAGE and self.target is not None and self.target.injection is None:
            raise PolicyError(
                f"{path}.target.injection",
                "must be set explicitly (statefulSet or webhook) when mode is stage: staging next "
                "to live brokers is opted into, never derived",
            )
        # Not a CEL rule either (quantities, Kubernetes 1.28): a sidecar whose limit cannot hold
        # its offset map is OOM-killed at its first clean, and again after every restart. The
        # operator's to judge before it injects; a tolerant reader (the sidecar loading what the
        # operator wrote, ``unknown_fields``) never refuses a policy for it.
        limit = self.sidecar.memory_limit
        strict = _UNKNOWN_FIELDS.get() is None
        if strict and self.target is not None and self.mode is not Mode.OBSERVE and limit is not None:
            needed = sidecar_memory_needed(self.cleaner)
            if parse_quantity(limit) < needed:
                raise PolicyError(
                    f"{path}.sidecar.resources.limits.memory",
                    f"{limit} cannot hold the cleaner: cleaner.dedupeBufferSize {self.cleaner.dedupe_buffer_size} "
                    f"bytes with {self.cleaner.threads} thread(s) needs at least {-(-needed // MIB)}Mi "
                    f"(the offset map, {SIDECAR_MEMORY_BASELINE // MIB}Mi for the process and "
                    f"{SIDECAR_MEMORY_PER_THREAD // MIB}Mi per thread); raise the limit or lower dedupeBufferSize",
                )


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def parse_policy(
    obj: Mapping[str, Any], *, source: str = "<policy>", unknown_fields: list[str] | None = None
) -> Policy:
    """A policy from a parsed YAML/JSON document: a whole manifest or a bare spec.

    A mapping with any of ``apiVersion``, ``kind``, ``metadata``, ``spec`` or ``status`` is a
    manifest (``apiVersion`` and ``kind``, when present, must both be there and be
    CompactionPolicy's; ``status`` is ignored; a missing spec means all defaults). Anything
    else is a bare spec. Raises :class:`PolicyError`; its message ends with ``(in SOURCE)``.

    ``unknown_fields``: a list that receives the dotted path of every unknown field, which is
    then ignored instead of being an error. Only the sidecar passes one: the file it reads may
    come from a newer operator whose CRD has fields this version does not know, and a sidecar
    that refused it would never load the new generation (docs/operator.md, "Version skew").
    Everything else (values, bounds, CEL rules, ``apiVersion``) is checked as strictly, but for
    the sidecar's memory bound (``sidecar_memory_needed``), which is the operator's to judge.
    """
    token = _UNKNOWN_FIELDS.set(unknown_fields)
    try:
        return _parse_document(obj)
    except PolicyError as exc:
        raise PolicyError(exc.field, f"{exc.message} (in {source})") from None
    finally:
        _UNKNOWN_FIELDS.reset(token)


def _parse_document(obj: object) -> Policy:
    if not isinstance(obj, Mapping):
        raise PolicyError("", f"a policy must be a mapping (a CompactionPolicy or its spec), got {_describe(obj)}")
    if not any(key in obj for key in _MANIFEST_KEYS):
        return _parse_object(Policy, obj, "spec")

    for key in obj:
        if key not in _MANIFEST_KEYS:
            _unknown_field("", key, list(_MANIFEST_KEYS))
    if "apiVersion" in obj or "kind" in obj:
        if obj.get("apiVersion") != API_VERSION:
            raise PolicyError("apiVersion", f"must be {API_VERSION}, got {_describe(obj.get('apiVersion'))}")
        if obj.get("kind") != KIND:
            raise PolicyError("kind", f"must be {KIND}, got {_describe(obj.get('kind'))}")
    metadata = obj.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        raise PolicyError("metadata", f"must be a mapping, got {_describe(metadata)}")
    name = _optional_str(metadata, "name")
    namespace = _optional_str(metadata, "namespace")
    generation = metadata.get("generation")
    if generation is not None and (isinstance(generation, bool) or not isinstance(generation, int)):
        raise PolicyError("metadata.generation", f"must be an integer, got {_describe(generation)}")
    spec = obj.get("spec")
    policy = _parse_object(Policy, {} if spec is None else spec, "spec")
    return dataclasses.replace(policy, name=name, namespace=namespace, policy_generation=generation)


def _optional_str(metadata: Mapping[str, Any], key: str) -> str | None:
    value = metadata.get(key)
    if value is not None and not isinstance(value, str):
        raise PolicyError(f"metadata.{key}", f"must be a string, got {_describe(value)}")
    return value


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice is an error (kubectl rejects it too)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen[key] = True
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read a policy file (a CompactionPolicy manifest or its spec). Raises :class:`PolicyError`."""
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise PolicyError("", f"cannot read policy file {source}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise PolicyError("", f"policy file {source} is not UTF-8: {exc.reason}") from None
    return parse_policy_text(text, source=source)


def parse_policy_text(text: str, *, source: str = "<policy>", unknown_fields: list[str] | None = None) -> Policy:
    """A policy from YAML (or JSON) text; see :func:`parse_policy`."""
    try:
        document = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError("", f"invalid YAML{where}: {problem} (in {source})") from None
    if document is None:
        raise PolicyError("", f"the policy is empty (in {source})")
    return parse_policy(document, source=source, unknown_fields=unknown_fields)


def walk_model(cls: type = Policy, prefix: str = "spec") -> Iterator[tuple[str, FieldSpec, Any]]:
    """Every YAML field of the model, depth first: (dotted path, spec, dataclass default).

    List items appear as ``path[]``. For tools and the CRD consistency tests.
    """
    for f, spec in spec_fields(cls):
        path = f"{prefix}.{spec.key}"
        yield path, spec, f.default
        kind: _Kind = spec.kind
        suffix = ""
        while isinstance(kind, _List):
            kind = kind.item
            suffix += "[]"
        if isinstance(kind, _Obj):
            yield from walk_model(kind.cls, path + suffix)
