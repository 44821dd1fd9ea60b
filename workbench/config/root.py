"""The root `Config`: the sections, the students, the device; its flat view, copies, field lookup and
coercion.

Every consumer reads these dataclasses: the CLI (`--set field=value`), the notebook's papermill
`parameters` cell (one variable per field, same names) and every result row (flattened with
`flat()`). `tests/config/test_config.py` keeps the notebook and the dataclasses in agreement.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from workbench.config import checks
from workbench.config.errors import ConfigError
from workbench.config.fields import (
    SECTIONS,
    BackendOptions,
    BenchConfig,
    DistillConfig,
    LMConfig,
    ModelConfig,
    ParallelConfig,
    TrainConfig,
    type_name,
)

DEFAULT_BACKENDS = ("torch_fp32", "torch_bf16", "te_bf16", "te_fp8:delayed", "te_fp8:current")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    lm: LMConfig = field(default_factory=LMConfig)
    options: BackendOptions = field(default_factory=BackendOptions)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    backends: list[str] = field(default_factory=lambda: list(DEFAULT_BACKENDS))
    """Students to compare, as 'backend' or 'backend:recipe' (see `workbench.backends.BACKENDS`)."""
    baseline: str = "torch_bf16"
    """Which student is the tutorial's 'baseline' in summary.json (must be in `backends`)."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """'auto' (CUDA when available, else CPU), 'cuda' or 'cpu'."""
    preset: str = "seed"
    """Name of the preset this config started from (recorded; set by `from_preset`)."""

    # ---- flat view -------------------------------------------------------------------------
    def flat(self) -> dict[str, Any]:
        """Every field as {name: value} with section-free names (the notebook/CLI/row names)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if dataclasses.is_dataclass(v):
                out.update(asdict(v))
            else:
                out[f.name] = list(v) if isinstance(v, (list, tuple)) else v
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def replace(self, **overrides: Any) -> Config:
        """A copy with flat or dotted field overrides applied (values coerced to the field's type)."""
        cfg = Config.from_dict(self.to_dict())
        for key, value in overrides.items():
            section, name = locate(key)
            target = getattr(cfg, section) if section else cfg
            setattr(target, name, _coerce(key, _field_type(section, name), value))
        return cfg

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Config:
        known = {f.name for f in fields(Config)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown config keys {sorted(unknown)}; allowed: {sorted(known)}")
        kw = dict(d)
        for name, cls in SECTIONS.items():
            if name in kw and isinstance(kw[name], dict):
                sub = kw[name]
                allowed = {f.name for f in fields(cls)}
                bad = set(sub) - allowed
                if bad:
                    raise ConfigError(f"unknown fields {sorted(bad)} in '{name}'; allowed: {sorted(allowed)}")
                kw[name] = cls(**sub)
        return Config(**kw)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def validate(self) -> Config:
        """Raise ConfigError on the first bad field (`checks.validate`); return self so calls can chain.
        The checks run once per state: a config validated where it was resolved (`from_preset`) is not
        checked again by the run it is handed to, and one changed since is checked anew."""
        state = repr(self)  # every field's value, of any type
        if self.__dict__.get("_validated") != state:  # not a field: in no row, no to_dict, no equality
            checks.validate(self)
            self.__dict__["_validated"] = state
        return self


# ---- field lookup and coercion ---------------------------------------------------------------
def flat_field_names() -> list[str]:
    return list(Config().flat())


def locate(key: str) -> tuple[str | None, str]:
    """'hidden' or 'model.hidden' -> ('model', 'hidden'); 'backends' -> (None, 'backends')."""
    if "." in key:
        section, _, name = key.partition(".")
        if section in SECTIONS and name in {f.name for f in fields(SECTIONS[section])}:
            return section, name
    else:
        for section, cls in SECTIONS.items():
            if key in {f.name for f in fields(cls)}:
                return section, key
        if key in {f.name for f in fields(Config)} and key not in SECTIONS:
            return None, key
    raise ConfigError(f"unknown config field {key!r}{did_you_mean(key)}; allowed: {sorted(flat_field_names())}")


def did_you_mean(key: str) -> str:
    """" (did you mean 'hidden'?)" for a near miss of a field name (difflib), else ''."""
    import difflib

    names = flat_field_names() + [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in fields(cls)]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _field_type(section: str | None, name: str) -> str:
    cls = SECTIONS[section] if section else Config
    return {f.name: type_name(f) for f in fields(cls)}[name]


def _coerce(key: str, t: str, value: Any) -> Any:
    """Strings from the CLI / papermill become the field's type `t` (`type_name`); a bad value names the field."""
    try:
        if t.startswith("list"):
            if isinstance(value, str):
                value = value.strip()
                if value.startswith("["):
                    return list(json.loads(value))
                return [v.strip() for v in value.split(",") if v.strip()]
            return list(value)
        if t == "bool":
            if isinstance(value, str):
                low = value.lower()
                if low not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                return low in ("true", "1", "yes")
            return bool(value)
        if t == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value) if not isinstance(value, str) else int(value.strip())
        if t == "float":
            return float(value)
        return str(value)
    except (ValueError, TypeError, json.JSONDecodeError):
        raise ConfigError(f"{key} expects a value of type {t}, got {value!r}") from None


def field_docs() -> dict[str, str]:
    """{flat field name: its docstring}, read from the attribute docstrings of the sections (fields.py) and
    of the root (this file): the one source of the CLI's, the notebook's and the docs' help."""
    import ast
    import inspect
    import sys

    docs: dict[str, str] = {}
    nodes = [
        n for mod in ("workbench.config.fields", __name__) for n in ast.parse(inspect.getsource(sys.modules[mod])).body
    ]
    for node in nodes:
        if isinstance(node, ast.ClassDef) and node.name in {c.__name__ for c in (*SECTIONS.values(), Config)}:
            body = node.body
            for a, b in itertools.pairwise(body):
                if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
                    docs[a.target.id] = " ".join(str(b.value.value).split())
    return {k: docs.get(k, "") for k in flat_field_names()}


def parse_set(items: list[str]) -> dict[str, Any]:
    """Parse CLI `--set field=value` items into overrides (values coerced later, by field type)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects field=value, got {item!r}; fields: {sorted(flat_field_names())}")
        locate(key.strip())  # fails early on unknown names
        out[key.strip()] = value
    return out


