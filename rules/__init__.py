"""Decisions as data: the Xid catalog now; rules, incidents and actions build on it."""
