"""The one configuration source: dataclasses, presets and validation.

    from workbench import config
    cfg = config.from_preset("cpu-smoke", hidden=128)   # a preset, overrides, validated once

  * `fields`: the sections (model, train, bench, distill, lm, options, parallel), a docstring on every
    field, allowed words as `Literal` types;
  * `root`: `Config` (the sections and the students), its flat view, field lookup and coercion;
  * `checks`: the validation, before any model is built: a bad value raises `ConfigError` naming the
    field and what is allowed;
  * `presets`: the preset table and `from_preset`.

A leaf of the package: nothing here imports anything else of workbench, so every module may import it.
Which backends exist is the backends' registry's knowledge; a run checks the students' names there.
"""
from workbench.config.checks import kind_task
from workbench.config.errors import ConfigError
from workbench.config.fields import (
    LM_LOSSES,
    LOSS_IMPLS,
    MLP_LOSSES,
    REGRESSION_KIND,
    SECTIONS,
    BackendOptions,
    BenchConfig,
    DistillConfig,
    LMConfig,
    ModelConfig,
    ParallelConfig,
    TrainConfig,
    choices,
    type_name,
)
from workbench.config.presets import (
    PRESET_CHOICES,
    PRESETS,
    default_preset_name,
    from_preset,
    preset_help,
)
from workbench.config.root import (
    DEFAULT_BACKENDS,
    Config,
    did_you_mean,
    field_docs,
    flat_field_names,
    locate,
    parse_set,
)

__all__ = [
    "DEFAULT_BACKENDS", "LM_LOSSES", "LOSS_IMPLS", "MLP_LOSSES", "PRESETS", "PRESET_CHOICES", "REGRESSION_KIND",
    "SECTIONS", "BackendOptions", "BenchConfig", "Config", "ConfigError", "DistillConfig", "LMConfig", "ModelConfig",
    "ParallelConfig", "TrainConfig", "choices", "default_preset_name", "did_you_mean", "field_docs", "flat_field_names",
    "from_preset", "kind_task", "locate", "parse_set", "preset_help", "type_name",
]
