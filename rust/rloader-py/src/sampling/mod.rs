//! Where indices and keys come from: where a shuffled index is made (in rloader-core, called
//! from here) and how the loops take keys from a sampler.
//!
//! - `samplers.rs`: the functions the Python samplers call to start a stream;
//! - `streams.rs`: `IndexChunks` and `BatchStream`, the index streams every sampler hands out;
//! - `keys.rs`: `SamplerKeys`, batches of keys from `iter(loader._index_sampler)`, as every loop
//!   takes them, and `KeySegment`, an auto loader's engine's share of them.

mod keys;
mod samplers;
mod streams;

pub use keys::{KeyBatch, KeySegment, SamplerKeys};
pub use samplers::register;
pub use streams::{BatchStream, IndexChunks};
