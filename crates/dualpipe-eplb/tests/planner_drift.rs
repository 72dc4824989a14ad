//! The drift benchmark on a small configuration: the improved arms never place avoidable
//! duplicates, the migration-aware arm moves far fewer replicas than the reference from
//! scratch, and the run is reproducible from its seed.

#[path = "../benches/support/drift.rs"]
#[allow(dead_code)]
mod drift;
use drift::{run_drift, Arm, DriftConfig};
use dualpipe_eplb::improved::PlannerOptions;

#[test]
fn drift_small_configuration() {
    let config = DriftConfig {
        layers: 3,
        intervals: 6,
        seed: 7,
        ..DriftConfig::default()
    };
    let opts = PlannerOptions {
        tolerance: 0.02,
        ..PlannerOptions::default()
    };
    let arms = [
        Arm::Reference,
        Arm::ImprovedFresh(PlannerOptions::default()),
        Arm::Improved(opts),
    ];
    let reports = run_drift(&config, &arms).unwrap();
    let (reference, fresh, ours) = (&reports[0], &reports[1], &reports[2]);
    assert_eq!(reference.samples, 3 * 6);
    assert_eq!(fresh.duplicate_layers, 0);
    assert_eq!(ours.duplicate_layers, 0);
    assert!(
        ours.moved * 2 < reference.moved,
        "{} vs {}",
        ours.moved,
        reference.moved
    );
    assert_eq!(ours.bytes, ours.moved as u64 * config.expert_bytes);
    for r in &reports {
        assert!(r.worst_balancedness > 0.0 && r.worst_balancedness <= r.mean_balancedness);
        assert!(r.mean_balancedness <= 1.0);
    }
    assert_eq!(run_drift(&config, &arms).unwrap(), reports);
}
