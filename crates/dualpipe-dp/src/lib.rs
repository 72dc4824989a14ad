//! Data-parallel gradient exchange for pipeline stages: bucketed, stamped with a logical
//! clock, optionally compressed with error feedback.
//!
//! Every worker of a stage's data-parallel group (the `D` replicas of that pipeline stage)
//! holds a [`GradExchange`] over a [`GradTransport`] connecting the group. A step:
//!
//! ```
//! use dualpipe_dp::{BucketLayout, ChannelTransport, ExchangeConfig, GradExchange};
//! # fn main() -> Result<(), dualpipe_dp::DpError> {
//! let layout = BucketLayout::new(&[3, 2], 16, 4)?; // two parameters, 16-byte buckets
//! let handles: Vec<_> = ChannelTransport::group(2)
//!     .into_iter()
//!     .map(|transport| {
//!         let layout = layout.clone();
//!         std::thread::spawn(move || {
//!             let worker = transport_rank(&transport) as f32;
//!             let mut ex = GradExchange::<f32, _>::new(ExchangeConfig::default(), layout, 0, transport)?;
//!             ex.begin_step(0)?;
//!             ex.start_bucket(1, &[worker, worker])?; // buckets in any order
//!             ex.start_bucket(0, &[1.0, 2.0, worker])?;
//!             ex.finish()?;
//!             Ok::<_, dualpipe_dp::DpError>(ex.param(0).to_vec())
//!         })
//!     })
//!     .collect();
//! # fn transport_rank(t: &ChannelTransport) -> usize { use dualpipe_dp::GradTransport; t.rank() }
//! for h in handles {
//!     assert_eq!(h.join().unwrap()?, vec![1.0, 2.0, 0.5]); // the mean over both workers
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Modules: [`codec`] (the compressors and their byte layouts), [`exchange`] (the
//! reduce-scatter + all-gather per bucket, error feedback), [`copies`] (a stage whose copies
//! are in several processes of a replica: summed inside the exchange), [`native`] (the uncompressed
//! exchange on a library's own all-reduce, e.g. MPI's; [`thread_sum`], an in-process one),
//! [`bucket_exchange`] (the calls both answer), [`clock`] (early, stale and
//! duplicate messages), [`message`] (the stamp and header), [`transport`] (channels, a runtime
//! `Link` such as MPI, a reordering wrapper for tests), [`layout`] (buckets), [`feedback`]
//! (the error-feedback state), [`stats`] (bytes and seconds), [`config`], [`float`],
//! [`error`]. See `docs/distributed.md`.

#![warn(missing_docs)]

pub mod bucket_exchange;
pub mod clock;
pub mod codec;
pub mod config;
pub mod copies;
pub mod error;
pub mod exchange;
pub mod feedback;
pub mod float;
pub mod layout;
pub mod message;
pub mod native;
pub mod stats;
pub mod thread_sum;
pub mod transport;

pub use bucket_exchange::BucketExchange;
pub use codec::{Codec, Compression, Rounding, UnknownCompression};
pub use config::{ExchangeConfig, Reduce, DEFAULT_CHUNK_VALUES};
pub use copies::{CopyLead, CopyPartner};
pub use error::DpError;
pub use exchange::GradExchange;
pub use feedback::ErrorFeedbackState;
pub use float::GradFloat;
pub use layout::{BucketLayout, DEFAULT_BUCKET_BYTES};
pub use message::{MsgHeader, MsgKey, Part};
pub use native::{AllReduce, NativeExchange, SumInFlight};
pub use stats::ExchangeStats;
pub use thread_sum::ThreadSum;
pub use transport::{
    ChannelTransport, GradTransport, Incoming, LinkTransport, Reordering, TransportError,
    TransportStats,
};
