//! Quantizers: k-means (k-means++ seeding, Elkan iterations) and product quantization.

pub mod fastscan;
pub mod kmeans;
pub mod multibit;
pub mod pca;
pub mod pq;
pub mod rabitq;

pub use kmeans::{kmeans, KMeansParams, KMeansResult};
pub use pq::PqCodebook;
