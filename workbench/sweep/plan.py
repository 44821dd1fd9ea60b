"""What a sweep asks for, for the driver and the report alike: its spec (a spec file, or sweep.json in the
sweep folder) and the points it plans (one per grid combination, named by a hash of its spec: the preset
and the point's overrides). Nothing here runs a point; workbench.sweep.index says which ran."""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workbench import config, results
from workbench.config import ConfigError

DEFAULT_ROOT = Path("results") / "sweeps"
SPEC_FILE = "sweep.json"


# ---- the spec ----------------------------------------------------------------------------------
@dataclass
class Spec:
    name: str
    preset: str = "auto"
    fixed: dict[str, Any] = field(default_factory=dict)
    """Overrides every point gets (`--set`, `set:`)."""
    grid: dict[str, list] = field(default_factory=dict)
    """axis -> values: a config field's values, or (linked axis) dicts of field values."""
    cell_timeout: int | None = None
    """Seconds one notebook cell may run before its point fails as 'timeout' (None: no limit)."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "preset": self.preset, "set": self.fixed, "grid": self.grid,
                "cell_timeout": self.cell_timeout}

    @staticmethod
    def from_dict(d: dict[str, Any], name: str | None = None) -> "Spec":
        unknown = set(d) - {"name", "preset", "set", "grid", "cell_timeout"}
        if unknown:
            raise ConfigError(
                f"sweep spec: unknown keys {sorted(unknown)}; allowed: name, preset, set, grid, cell_timeout"
            )
        name = name or d.get("name")
        if not name:
            raise ConfigError("sweep spec: a sweep needs a name (--name or `name:`)")
        timeout = d.get("cell_timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0):
            raise ConfigError(f"sweep spec: cell_timeout must be a positive number of seconds, got {timeout!r}")
        spec = Spec(name=results.check_name(str(name), "sweep name"), preset=str(d.get("preset") or "auto"),
                    fixed=dict(d.get("set") or {}),
                    grid={str(k): v if isinstance(v, list) else [v] for k, v in (d.get("grid") or {}).items()},
                    cell_timeout=timeout)
        spec.axes()  # fail early on a malformed grid
        return spec

    def axes(self) -> list[list[dict[str, Any]]]:
        """Each axis as the list of field overrides its values stand for."""
        out = []
        for axis, values in self.grid.items():
            if not values:
                raise ConfigError(f"sweep grid: axis {axis!r} has no values")
            if all(isinstance(v, dict) for v in values):  # linked axis: fields move together
                for v in values:
                    for k in v:
                        config.locate(k)
                out.append([dict(v) for v in values])
            elif any(isinstance(v, dict) for v in values):
                raise ConfigError(f"sweep grid: axis {axis!r} mixes field values and point dicts")
            else:
                config.locate(axis)  # a plain axis is named by the field it varies
                out.append([{axis: v} for v in values])
        return out or [[{}]]


@dataclass
class Point:
    id: str
    grid: dict[str, Any]
    """This point's grid values (what distinguishes it from the sweep's other points)."""
    overrides: dict[str, Any]
    """Everything passed to the notebook: the spec's fixed overrides and the grid values."""
    nproc: int = 1
    """GPUs the point's run uses (its config's `parallel.nproc`): the sweep gives it a worker with that many."""


def point_nproc(cfg: config.Config) -> int:
    """GPUs a run of `cfg` uses: `parallel.nproc` where the config has that section, else one."""
    return int(getattr(getattr(cfg, "parallel", None), "nproc", 1) or 1)


POINT_ID_VERSION = 2
"""Part of every point id: bumped when what an id stands for changes. Ids before version 2 hashed the whole
resolved config, so every new config field renamed every point; `point_folders` still finds those."""


def point_id(cfg: config.Config, overrides: dict[str, Any]) -> str:
    """Short, stable id of a point: its preset and its overrides, each under the field's full name with
    the config's typed value (so 'hidden: "64"' and 'hidden: 64' are one point). Only what the spec says
    goes in: a field added to the config later (at its default) leaves every id as it was."""
    typed = {}
    for key in overrides:
        section, name = config.locate(key)
        value = getattr(getattr(cfg, section), name) if section else getattr(cfg, name)
        typed[f"{section}.{name}" if section else name] = list(value) if isinstance(value, tuple) else value
    spec = {"id_version": POINT_ID_VERSION, "preset": cfg.preset, "overrides": typed}
    return hashlib.sha1(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:10]


def plan(spec: Spec) -> list[Point]:
    """The sweep's points in grid order; every point's config is validated, and its backends and model kind
    checked against their registries, before anything runs."""
    from workbench.run.runner import check_registered  # torch: only when a sweep is planned

    points: dict[str, Point] = {}
    for combo in itertools.product(*spec.axes()):
        grid: dict[str, Any] = {}
        for part in combo:
            grid.update(part)
        overrides = {**spec.fixed, **grid}
        try:
            cfg = config.from_preset(spec.preset, **overrides)
            check_registered(cfg)
        except ConfigError as e:
            raise ConfigError(f"sweep point {grid}: {e}") from None
        flat = cfg.flat()
        typed_grid = {k: flat[config.locate(k)[1]] for k in grid}
        pid = point_id(cfg, overrides)
        points.setdefault(pid, Point(pid, typed_grid, overrides, point_nproc(cfg)))  # one point, one run
    return list(points.values())


def recorded_id(run_dir: Path) -> str | None:
    """The point id of a run folder from what its config.json says was asked for (preset, overrides);
    None where that cannot be read or no longer makes a valid config."""
    try:
        requested = dict(results.read_json(run_dir / "config.json").get("requested") or {})
        preset = requested.pop("preset", None) or "auto"
        return point_id(config.from_preset(preset, **requested), requested)
    except (OSError, ValueError, AttributeError, ConfigError):  # JSON errors are ValueErrors
        return None


def parse_grid_args(items: list[str], links: list[str]) -> dict[str, list]:
    """`--grid field=v1,v2` (or `field=[...]` in YAML/JSON, e.g. for list values such as backends) and
    `--link a,b`: the named axes advance together (zipped) instead of multiplying."""
    grid: dict[str, list] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ConfigError(f"--grid expects field=v1,v2,..., got {item!r}")
        config.locate(key)
        if value.startswith("["):
            values = yaml.safe_load(value)
        else:
            values = [v.strip() for v in value.split(",") if v.strip()]
        grid[key] = list(values)
    for link in links:
        names = [n.strip() for n in link.split(",") if n.strip()]
        missing = [n for n in names if n not in grid]
        if len(names) < 2 or missing:
            raise ConfigError(f"--link {link!r}: name two or more --grid fields (missing: {missing})")
        lengths = {n: len(grid[n]) for n in names}
        if len(set(lengths.values())) != 1:
            raise ConfigError(f"--link {link!r}: linked axes need the same number of values, got {lengths}")
        zipped = [dict(zip(names, vals)) for vals in zip(*(grid[n] for n in names))]
        # the linked axis takes the place of its first field: axis order is loop order (first = outermost)
        grid = {("+".join(names) if k == names[0] else k): (zipped if k == names[0] else v)
                for k, v in grid.items() if k == names[0] or k not in names}
    return grid


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """A spec file (JSON if it ends in .json, else YAML) as a dict of the right shape; a file that cannot
    be read or parsed, or holds the wrong types, is a ConfigError naming the file and what is wrong."""
    where = f"sweep spec {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from None
    try:
        d = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not valid JSON (line {e.lineno}: {e.msg})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({f'line {mark.line + 1}: ' if mark else ''}{problem})") from None
    return check_spec_shape(d if d is not None else {}, where)


def check_spec_shape(d: Any, where: str = "sweep spec") -> dict[str, Any]:
    """The types Spec.from_dict relies on: a mapping; name and preset texts; set a mapping of fields;
    grid a mapping of axis -> a value or a list of values (a linked axis: a list of mappings). Field
    names are texts everywhere; the values themselves are checked by the config when points are planned."""
    def kind(v: Any) -> str:
        return "nothing" if v is None else type(v).__name__

    if not isinstance(d, dict):
        raise ConfigError(f"{where}: expected a mapping with keys name, preset, set, grid; got {kind(d)}")
    for key in ("name", "preset"):
        v = d.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int))):
            raise ConfigError(f"{where}: `{key}` must be a text, got {kind(d[key])} {d[key]!r}")
    for key, what in (("set", "field: value"), ("grid", "axis: [values]")):
        if d.get(key) is not None and not isinstance(d[key], dict):
            raise ConfigError(f"{where}: `{key}` must be a mapping of {what}, got {kind(d[key])} {d[key]!r}")
    linked = [v for values in (d.get("grid") or {}).values() for v in (values if isinstance(values, list) else [values])
              if isinstance(v, dict)]
    for fields in [d.get("set") or {}, d.get("grid") or {}, *linked]:
        bad = [k for k in fields if not isinstance(k, str)]
        if bad:
            raise ConfigError(f"{where}: field and axis names must be texts, got {bad[0]!r} in {fields!r}")
    return d


# ---- the spec a sweep folder holds -------------------------------------------------------------
def stored_spec(sweep_dir: str | Path) -> Spec | None:
    """The sweep's spec (sweep.json), None when there is none; a damaged one is a ConfigError naming the
    file and what to do."""
    path = Path(sweep_dir) / SPEC_FILE
    if not path.exists():
        return None
    try:
        return Spec.from_dict(load_spec_file(path))
    except ConfigError as e:
        raise ConfigError(f"{e}; restore it (from a copy or version control) or run the sweep again from its "
                          f"spec file (workbench sweep SPEC.yaml) to rewrite it") from None


def planned_ids(sweep_dir: str | Path) -> set[str] | None:
    """Point ids the sweep's current spec (sweep.json) plans; None when there is no spec file."""
    spec = stored_spec(sweep_dir)
    return None if spec is None else {p.id for p in plan(spec)}
