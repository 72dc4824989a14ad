//! [`Checkpointing`]: a run's checkpoints from the writer's start to the note of what it
//! saved.

use super::{CheckpointError, CheckpointOptions, CheckpointWriter, OnSaved, WriteScope};

/// The background writer of one run, when it saves checkpoints.
#[derive(Debug, Default)]
pub struct Checkpointing {
    writer: Option<CheckpointWriter>,
}

impl Checkpointing {
    /// Starts the writer `options` asks for (none without options), writing `scope` and
    /// telling `on_saved` of every checkpoint it saved.
    pub fn start(
        options: Option<&CheckpointOptions>,
        scope: WriteScope,
        on_saved: Option<OnSaved>,
    ) -> Result<Self, CheckpointError> {
        let writer = match options {
            Some(options) => Some(CheckpointWriter::start_with(options, scope, on_saved)?),
            None => None,
        };
        Ok(Checkpointing { writer })
    }

    /// The writer, to hand the trainers (`None`: no checkpoints).
    pub fn writer(&self) -> Option<&CheckpointWriter> {
        self.writer.as_ref()
    }

    /// Waits for every queued checkpoint (stop the trainers' checkpoints first); a line that
    /// tells what was saved, when anything was.
    pub fn finish(self) -> Result<Option<String>, CheckpointError> {
        let Some(writer) = self.writer else {
            return Ok(None);
        };
        let saved = writer.finish()?;
        Ok(saved.last().map(|last| {
            let seconds: f64 = saved.iter().map(|s| s.seconds).sum();
            format!(
                "saved {} checkpoint(s), the last {} ({} bytes; {:.1} ms each on the writer \
                 thread)",
                saved.len(),
                last.path.display(),
                last.bytes,
                1e3 * seconds / saved.len() as f64
            )
        }))
    }
}
