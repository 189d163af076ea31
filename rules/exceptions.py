"""Errors raised by the rules package.

Exception tree::

    RulesError
    └── CatalogError     (the Xid catalog file is unreadable or invalid; names the entry)
"""

from __future__ import annotations


class RulesError(Exception):
    """Base class for errors in rule and catalog data."""


class CatalogError(RulesError):
    """The Xid catalog file is broken; the message names the file and the entry."""
