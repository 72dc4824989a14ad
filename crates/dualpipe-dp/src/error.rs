//! What can go wrong in a gradient exchange.

use std::time::Duration;

use crate::codec::CodecError;
use crate::message::MsgKey;
use crate::transport::TransportError;
use crate::Compression;

/// A failed exchange or a refused configuration; every message names what, where and how to fix.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DpError {
    /// The configuration cannot work.
    #[error("invalid data-parallel configuration: {0}")]
    Config(String),
    /// A bucket index past the layout.
    #[error("bucket {bucket} does not exist: the layout has {buckets} buckets")]
    NoSuchBucket {
        /// The index asked for.
        bucket: usize,
        /// Buckets in the layout.
        buckets: usize,
    },
    /// A bucket's gradients of the wrong length.
    #[error("bucket {bucket} holds {expected} values but {got} were given")]
    BucketLength {
        /// The bucket.
        bucket: usize,
        /// Its length in the layout.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// A bucket started twice in one step.
    #[error("bucket {bucket} was already started in step {step}")]
    StartedTwice {
        /// The bucket.
        bucket: usize,
        /// The step.
        step: u64,
    },
    /// An exchange call outside a step (call `begin_step` first).
    #[error("no step in progress: call begin_step before {0}")]
    NoStep(&'static str),
    /// `finish` called before every bucket was started.
    #[error(
        "step {step}: bucket(s) {missing:?} were never started; start every bucket before finish"
    )]
    NotStarted {
        /// The step.
        step: u64,
        /// The buckets not started.
        missing: Vec<usize>,
    },
    /// `begin_step` while the previous step's exchange is not finished.
    #[error("step {step} is not finished: call finish before beginning step {next}")]
    Unfinished {
        /// The unfinished step.
        step: u64,
        /// The step asked for.
        next: u64,
    },
    /// Steps must go forward.
    #[error("step {requested} cannot follow step {current}: steps must increase")]
    StepNotLater {
        /// The current step.
        current: u64,
        /// The step asked for.
        requested: u64,
    },
    /// A message of a past step arrived.
    #[error(
        "refused {key} from worker {from}: this worker is at step {current}, so it is stale \
         (workers out of step; every worker must run the same steps)"
    )]
    Stale {
        /// Its sender.
        from: usize,
        /// The message.
        key: MsgKey,
        /// This worker's step.
        current: u64,
    },
    /// A message more than one step ahead arrived.
    #[error(
        "refused {key} from worker {from}: this worker is at step {current} and no worker can \
         be more than one step ahead (workers out of step)"
    )]
    FromTheFuture {
        /// Its sender.
        from: usize,
        /// The message.
        key: MsgKey,
        /// This worker's step.
        current: u64,
    },
    /// A message arrived twice.
    #[error("a second copy of {key} arrived from worker {from}; every message is sent once")]
    Duplicate {
        /// Its sender.
        from: usize,
        /// The message.
        key: MsgKey,
    },
    /// A message for another stage's group arrived.
    #[error(
        "{key} from worker {from} belongs to another stage: this is the group of stage {stage}"
    )]
    WrongStage {
        /// Its sender.
        from: usize,
        /// The message.
        key: MsgKey,
        /// This group's stage.
        stage: usize,
    },
    /// A message of an earlier step was never used.
    #[error("step {next} cannot begin: {count} message(s) of earlier steps were never used, e.g. {key} from worker {from}")]
    Leftover {
        /// Its sender.
        from: usize,
        /// One unused message.
        key: MsgKey,
        /// How many.
        count: usize,
        /// The step asked for.
        next: u64,
    },
    /// A peer encodes differently or holds another layout.
    #[error(
        "{key} from worker {from} holds {got_values} values as {got}, but this worker expects \
         {values} values as {expected}: every worker needs the same model, bucket size, \
         `gradient_compression` and `compression_warmup`"
    )]
    Mismatch {
        /// Its sender.
        from: usize,
        /// The message.
        key: MsgKey,
        /// The compression this worker uses.
        expected: Compression,
        /// The compression of the message.
        got: Compression,
        /// Values expected.
        values: usize,
        /// Values announced.
        got_values: usize,
    },
    /// A body that does not decode.
    #[error("{key} from worker {from} is malformed: {error}")]
    Decode {
        /// Its sender.
        from: usize,
        /// The message.
        key: MsgKey,
        /// What is wrong.
        error: CodecError,
    },
    /// A message did not come in time.
    #[error(
        "timed out after {waited:?} waiting for {missing} (is every worker of the group running?)"
    )]
    TimedOut {
        /// How long the wait lasted.
        waited: Duration,
        /// What was missing.
        missing: String,
    },
    /// The transport failed.
    #[error("gradient transport: {0}")]
    Transport(#[from] TransportError),
    /// Error-feedback state that does not fit this exchange.
    #[error("error-feedback state does not fit: {0}")]
    FeedbackState(String),
}
