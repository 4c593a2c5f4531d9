//! Index generation for rloader's samplers: pure Rust, no Python.
//!
//! Each module is one of `torch.utils.data`'s samplers:
//!
//! * [`random`]: `RandomSampler` (uniform shuffles, with or without replacement);
//! * [`weighted`]: `WeightedRandomSampler` (alias table; exponential keys without replacement);
//! * [`distributed`]: `DistributedSampler` (torch's padding and sharding);
//! * [`batch`]: `BatchSampler` over any index stream.
//!
//! [`prefetch`] runs a stream's draws ahead on a thread of its own.
//!
//! All randomness comes from [`Rng`], whose output for a given seed is part of
//! rloader's stable contract (see [`rng`]).

pub mod batch;
pub mod buffer;
mod compact;
pub mod distributed;
pub mod prefetch;
pub mod random;
pub mod rng;
pub mod weighted;

#[cfg(test)]
mod test_stats;

pub use batch::Batches;
pub use distributed::{distributed_indices, distributed_num_samples, distributed_sizes};
pub use random::{permutation, shuffle, RandomIndices};
pub use rng::Rng;
pub use weighted::{weighted_without_replacement, AliasTable, WeightError, WeightedIndices};

/// An index stream of any sampler, boxed for the bindings.
pub type BoxedIndices = Box<dyn Iterator<Item = u64> + Send>;
