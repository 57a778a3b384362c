"""The data layer's one exception, in a module of its own so that every reader of a data set
(the generic sources and the FEMNIST reader they call) can raise it without importing each
other."""

from __future__ import annotations


class DataNotFound(FileNotFoundError):
    """A data set is not on disk; the message says where we looked and how to get it."""
