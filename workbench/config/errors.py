"""Errors a user can act on. A leaf: every module may import it, it imports nothing of ours."""


class ConfigError(ValueError):
    """A configuration value is not allowed; the message names the field and the allowed values."""
