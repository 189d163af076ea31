"""Pure functions that turn raw source text into findings (Xid lines, ...)."""
