//! The Tally cluster client: leader tracking, same-event-id retries, `ResolveEvent` on lost
//! acknowledgements, automatic batching, typed reads, and docs/spec.md §9's deterministic ids.

pub mod batcher;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod error;
pub mod ids;
pub mod nodes;
pub mod outcome;
pub mod reads;
pub mod region;

pub use batcher::BatchingClient;
pub use client::TallyClient;
pub use clock::wall_clock_ms;
pub use config::{BatchConfig, ClientConfig, Transport};
pub use error::ClientError;
pub use outcome::Outcome;
pub use tally_api::convert::list_page::{HoldPage, UsagePage};
