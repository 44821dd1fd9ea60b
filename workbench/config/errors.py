"""The error of a value a user can act on: raised by the validation here and by every module that finds a
configured value it cannot use (a Hugging Face folder, a tokenizer, a loss). It lives with the configuration,
the package's leaf, so that every module may import it."""


class ConfigError(ValueError):
    """A configuration value is not allowed; the message names the field and the allowed values."""
