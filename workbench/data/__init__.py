"""Data for the language-model students: real text read offline, tokenized, split and batched (text)."""
from workbench.data.text import TextData, TextDataError, TextSpec, load_text  # noqa: F401 - the package's face
