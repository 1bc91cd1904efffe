//! DwarfStar distributed inference: pipeline-parallel stages over TCP.
//!
//! A route is the coordinator's local layers (`0:K`) followed by workers in layer order, every
//! stage behind the same [`exec::StageExec`] trait, so a route of remote stages runs the same code
//! as a single local stage. See `protocol` for the wire format, `coordinator` for registration and
//! route planning, `route` for execution (pipelined prefill, per-token hop chains, replay), and
//! `worker` for the worker loop, `wire` for the data path without copies (gathered frame writes,
//! borrowed decode, reused buffers) and `prefill_plan` for the micro-chunk picked from measured costs.
pub mod args;
pub mod auth;
pub mod cli;
pub mod codec;
pub mod coordinator;
pub mod error;
pub mod exec;
pub mod generate;
pub mod identity;
pub mod prefill_plan;
pub mod protocol;
pub mod route;
pub mod spin;
pub mod telemetry;
pub mod wire;
pub mod worker;

pub use args::{DistArgs, Role};
pub use coordinator::{CoordConfig, Coordinator};
pub use error::{DistError, Result};
pub use exec::{LocalStage, StageExec};
pub use route::{DistSession, RouteOptions, TokenOut};
pub use worker::{run_worker, WorkerOptions};
