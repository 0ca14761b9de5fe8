//! Quantizers: k-means (k-means++ seeding, Elkan iterations) and product quantization.

pub mod kmeans;
pub mod pq;

pub use kmeans::{kmeans, KMeansParams, KMeansResult};
pub use pq::PqCodebook;
