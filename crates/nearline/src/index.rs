//! Building and opening an index.
