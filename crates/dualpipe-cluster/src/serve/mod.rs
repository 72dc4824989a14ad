//! The real mode: `dualpipe cluster serve` runs real training jobs as child processes on
//! local slots (one rank each), moves and resizes them by checkpoint, stop and resume,
//! resumes crashed ones, and journals everything (docs/cluster.md, "Real mode").
//!
//! * [`spec`]: what is submitted and what is recorded of each job.
//! * [`policy`]: the decisions of one tick: the simulator's elastic policy on a view of the
//!   real pool, pure.
//! * [`process`]: the [`Launcher`] that knows the training command; spawning, signals and
//!   process identities.
//! * [`journal`]: the state file and the directory lock.
//! * [`access`]: the API's token and the loopback rule.
//! * [`api`]: the HTTP/JSON API's handler (on `dualpipe_http`'s bounded server).
//! * [`export`]: the scheduler's Prometheus metrics; [`scrape`]: reading a job's.
//! * [`scheduler`]: the loop, [`serve`]; its answers to calls and its recovery after a
//!   restart are in `calls` and [`recover`].

pub mod access;
pub mod api;
mod calls;
pub mod export;
pub mod journal;
pub mod policy;
pub mod process;
pub mod recover;
pub mod scheduler;
pub mod scrape;
pub mod spec;

pub use policy::{Action, PolicyParams};
pub use process::{Identity, JobPaths, Launch, Launcher};
pub use scheduler::{last_step, serve, ServeOptions};
pub use spec::{JobRecord, JobRequest, Phase};
