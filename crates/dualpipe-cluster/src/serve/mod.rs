//! The real mode: `dualpipe cluster serve` runs real training jobs as child processes on
//! local slots (one rank each), moves and resizes them by checkpoint, stop and resume,
//! resumes crashed ones, and journals everything (docs/cluster.md, "Real mode").
//!
//! * [`spec`]: what is submitted and what is recorded of each job.
//! * [`policy`]: the decisions of one tick (admission, migration, shrink, grow), pure.
//! * [`process`]: the [`Launcher`] that knows the training command; spawning and signals.
//! * [`journal`]: the state file and the directory lock.
//! * [`api`]: the HTTP/JSON API; [`http`]: its client side and the scrapes.
//! * [`export`]: the scheduler's Prometheus metrics.
//! * [`scheduler`]: the loop, [`serve`].

pub mod api;
pub mod export;
pub mod http;
pub mod journal;
pub mod policy;
pub mod process;
pub mod scheduler;
pub mod spec;

pub use policy::{Action, PolicyParams};
pub use process::{JobPaths, Launch, Launcher};
pub use scheduler::{last_step, serve, ServeOptions};
pub use spec::{JobRecord, JobRequest, Phase};
