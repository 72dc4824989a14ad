//! Property tests: every generated schedule of every kind validates, compute-only and lowered,
//! and survives both text formats.

use dualpipe_schedule::format::{csv, json};
use dualpipe_schedule::{generate, lower, validate, ScheduleError, ScheduleKind};
use proptest::prelude::*;

fn kind() -> impl Strategy<Value = ScheduleKind> {
    (0..ScheduleKind::ALL.len()).prop_map(|i| ScheduleKind::ALL[i])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn generated_schedules_validate(
        kind in kind(),
        ranks in 1usize..32,
        micro_batches in 1usize..80,
        virtual_stages in 1usize..4,
    ) {
        let v = if kind == ScheduleKind::Interleaved { virtual_stages } else { 1 };
        match generate(kind, ranks, micro_batches, v) {
            // A configuration the kind does not support (e.g. DualPipe with odd ranks).
            Err(ScheduleError::InvalidConfig(e)) => prop_assert!(!e.to_string().is_empty()),
            Err(e) => prop_assert!(false, "{kind}: unexpected error {e}"),
            Ok(s) => {
                prop_assert!(s.programs.iter().flatten().all(|op| op.is_compute()));
                validate(&s).map_err(|e| TestCaseError::fail(format!("{kind} compute-only: {e}")))?;
                let lowered = lower(&s);
                validate(&lowered).map_err(|e| TestCaseError::fail(format!("{kind} lowered: {e}")))?;
                prop_assert_eq!(&json::from_str(&json::to_string(&lowered)).unwrap(), &lowered);
                prop_assert_eq!(&csv::from_str(&csv::to_string(&s), Some(kind)).unwrap(), &s);
            }
        }
    }
}
