//! Presets and the automatic choice.
