//! Caches: what the search memory budget holds.
