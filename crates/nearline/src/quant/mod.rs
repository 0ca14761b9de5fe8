//! Quantizers: k-means (k-means++ seeding, Elkan iterations), product
//! quantization, PCA and random rotations, RaBitQ codes and the FastScan
//! kernel that scores them.

pub mod fastscan;
pub mod kmeans;
pub mod pca;
pub mod pq;
pub mod rabitq;

pub use kmeans::{kmeans, KMeansParams, KMeansResult};
pub use pq::PqCodebook;
