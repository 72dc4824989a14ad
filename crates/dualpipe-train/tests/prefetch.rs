//! The trainer draws the next step's batch during the current step's pipeline when the run
//! has a next step: that must change no result.

use dualpipe_schedule::ScheduleKind;
use dualpipe_train::{DType, TrainConfig, Trainer};
use dualpipe_train::{ModelSection, ScheduleSection};

fn losses(steps_in_config: usize) -> Vec<u64> {
    let config = TrainConfig {
        model: ModelSection {
            hidden: 4,
            layers_per_stage: 1,
            dtype: DType::F64,
            ..TrainConfig::MLP.model
        },
        schedule: ScheduleSection::new(ScheduleKind::DualPipe, 2, 4, 3),
        steps: steps_in_config,
        ..TrainConfig::MLP
    };
    let mut trainer = Trainer::new(config).unwrap();
    (0..3)
        .flat_map(|_| trainer.step().unwrap().losses)
        .map(f64::to_bits)
        .collect()
}

#[test]
fn prefetching_the_next_batch_changes_nothing() {
    // `steps: 3` prefetches before steps 1 and 2; `steps: 1` never does.
    assert_eq!(losses(3), losses(1));
}
