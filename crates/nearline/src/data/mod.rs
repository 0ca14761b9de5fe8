//! Vector data: element types, vector files (fbin/u8bin/i8bin, fvecs/bvecs/ivecs,
//! npy), memory-mapped matrices and exact ground truth.

pub mod files;
pub mod groundtruth;
pub mod matrix;

pub use files::{
    read_ground_truth, read_range_ground_truth, write_ground_truth, write_range_ground_truth,
    GroundTruth, RangeGroundTruth, VectorFileFormat,
};
pub use matrix::{Matrix, MatrixView};
