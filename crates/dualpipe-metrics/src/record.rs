//! [`StepRecord`]: every figure of one training step, as the run log stores it (one JSON line
//! per step) and the Prometheus metrics expose it.

use serde::{Deserialize, Serialize};

/// Where one rank's pipeline time went during a step, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankRecord {
    /// The rank.
    pub rank: usize,
    /// CPU time of the rank's thread.
    pub busy_seconds: f64,
    /// Time the rank waited for a message (its share of the pipeline bubble).
    pub message_wait_seconds: f64,
    /// Time the rank was runnable but waited for a core.
    pub core_wait_seconds: f64,
}

/// Bytes a step sent between ranks, by what they carried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BytesSent {
    /// Forward activations.
    pub activation: u64,
    /// Backward gradients (of activations, between pipeline stages).
    pub gradient: u64,
    /// MoE expert traffic (dispatch and combine; 0 until MoE layers exist).
    pub expert: u64,
    /// Data-parallel gradient exchange: what this replica sent, compressed, headers included
    /// (0 with one replica; absent in logs written before it existed).
    #[serde(default)]
    pub data_parallel: u64,
}

/// Every figure of one finished step (one line of the JSONL run log).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The step, counted from 1.
    pub step: usize,
    /// Seconds since the run's first step started, at the end of this one.
    pub elapsed_seconds: f64,
    /// Wall-clock seconds of the step (data, pipeline, gradient sum, optimizer).
    pub step_seconds: f64,
    /// Measured pipeline makespan of the step, in seconds.
    pub pipeline_seconds: f64,
    /// The step's training loss (mean over its micro-batches).
    pub loss: f64,
    /// The validation loss, on the steps that measured one.
    pub validation_loss: Option<f64>,
    /// Tokens (rows for the MLP model) this step trained on.
    pub tokens: u64,
    /// Tokens trained on since the run started, this step included.
    pub tokens_total: u64,
    /// This step's tokens per wall-clock second.
    pub tokens_per_second: f64,
    /// Measured bubble ratio of the step: waits for a message only, 0-1.
    pub bubble_ratio: f64,
    /// The simulator's bubble ratio for the schedule with the op times measured so far.
    pub bubble_ratio_simulated: Option<f64>,
    /// Share of rank time spent waiting for a core, 0-1.
    pub core_wait_ratio: f64,
    /// Share of the step's wall-clock time this replica spent in the data-parallel gradient
    /// exchange, 0-1 (0 with one replica; pipeline messages overlap compute and are part of
    /// the bubble).
    pub communication_overhead_ratio: f64,
    /// Rank threads this process ran at once.
    pub rank_threads: usize,
    /// Cores this process could use.
    pub cores: usize,
    /// Every rank's split of the step.
    pub ranks: Vec<RankRecord>,
    /// Bytes sent between ranks.
    pub bytes_sent: BytesSent,
}
