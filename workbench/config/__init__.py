"""The one configuration source (being split into modules)."""
from workbench.config.errors import ConfigError  # noqa: F401
from workbench.config.fields import *  # noqa: F401,F403
from workbench.config.fields import LM_LOSSES, LOSS_IMPLS, PRESET_CHOICES, PRESETS, SECTIONS  # noqa: F401
