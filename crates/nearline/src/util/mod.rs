//! Small utilities shared across components.

pub mod budget;

pub use budget::Budget;
