//! The job layer driven by a configuration, not flags: a program that builds a `JobConfig`
//! gets checkpoints, resume and the notes, in field words.

use dualpipe_schedule::ScheduleKind;
use dualpipe_train::job::{Job, JobConfig, Resume};
use dualpipe_train::{DType, ModelKind, ModelSection, ScheduleSection, TrainConfig};

fn tiny(steps: usize) -> TrainConfig {
    TrainConfig {
        model: ModelSection {
            kind: ModelKind::Mlp,
            hidden: 8,
            layers_per_stage: 1,
            dtype: DType::F64,
            ..TrainConfig::MLP.model
        },
        schedule: ScheduleSection::new(ScheduleKind::DualPipe, 2, 4, 4),
        steps,
        ..TrainConfig::MLP
    }
}

#[test]
fn a_job_writes_checkpoints_resumes_them_and_words_refusals_in_fields() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("ckpt");
    let mut job = JobConfig::new(tiny(2));
    job.checkpoint.dir = Some(checkpoints.clone());
    job.checkpoint.every = 1;
    let mut said = Vec::new();
    let first = Job::run(&job, None, |_, _| Ok(()), &mut |l| said.push(l.to_string()))
        .unwrap()
        .expect("a local job reports");
    assert_eq!(first.summary.losses.len(), 2);
    assert!(checkpoints.join("step-000002").is_dir(), "{said:?}");

    // A fresh job into the same directory is refused, in field words.
    let err = Job::run(&job, None, |_, _| Ok(()), &mut |_| {}).unwrap_err();
    assert!(err.usage, "{err}");
    assert!(
        err.message.starts_with("checkpoint.dir: ") && err.message.contains("checkpoint.resume"),
        "{err}"
    );
    assert!(!err.message.contains("--"), "{err}");

    // Resuming continues after step 2 and tells so.
    let mut resumed = JobConfig::new(tiny(4));
    resumed.checkpoint = job.checkpoint.clone();
    resumed.checkpoint.resume = Resume::Latest;
    let mut said = Vec::new();
    let second = Job::run(&resumed, None, |_, _| Ok(()), &mut |l| {
        said.push(l.to_string())
    })
    .unwrap()
    .unwrap();
    assert!(
        said.iter()
            .any(|l| l.starts_with("resuming from") && l.contains("step 2 done")),
        "{said:?}"
    );
    assert!(
        second.summary.losses.len() >= 2,
        "{:?}",
        second.summary.losses
    );
    assert!(checkpoints.join("step-000004").is_dir());
}

#[test]
fn the_job_checks_what_the_training_configuration_cannot_hold() {
    let mut job = JobConfig::new(tiny(1));
    job.checkpoint.every = 0;
    let err = Job::run(&job, None, |_, _| Ok(()), &mut |_| {}).unwrap_err();
    assert!(
        err.usage && err.message.starts_with("checkpoint.every 0"),
        "{err}"
    );
}
