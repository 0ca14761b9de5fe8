//! Small utilities: byte budgets.
