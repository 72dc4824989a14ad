//! Messages charged by the link they cross, and per-rank speeds.

use dualpipe_schedule::{build, ScheduleKind};
use dualpipe_sim::{simulate, CommCost, CostModel, Topology};

fn topology(inter_dc_latency: f64) -> Topology {
    Topology::from_json(&format!(
        r#"{{"links": {{"intra_node": {{"latency": 0.0, "bandwidth": 1000.0}},
            "inter_node": {{"latency": 0.1, "bandwidth": 100.0}},
            "inter_datacenter": {{"latency": {inter_dc_latency}, "bandwidth": 10.0}}}},
          "datacenters": [
            {{"name": "a", "nodes": [{{"name": "n", "devices": [{{"name": "g", "speed": 1, "memory": 1}}]}}]}},
            {{"name": "b", "nodes": [{{"name": "n", "devices": [{{"name": "g", "speed": 2, "memory": 1}}]}}]}}]}}"#
    ))
    .unwrap()
}

#[test]
fn a_message_occupies_its_sender_for_the_transfer_and_arrives_a_latency_later() {
    let schedule = build(ScheduleKind::OneFOneB, 2, 1, 1).unwrap();
    let t = topology(0.5);
    let net = t.network(&[0, 1], vec![10]).unwrap();
    // Transfer 10 bytes / 10 B/s = 1 s, latency 0.5 s: rank 0's F ends at 1, the activations
    // arrive at 2.5; rank 1 runs F, B (3 s) and its gradients arrive at 5.5 + 1.5 = 7; B ends 9.
    let cost = CostModel::uniform(1.0, 2.0, 1.0, 3.0).with_network(net.clone());
    let timeline = simulate(&schedule, &cost).unwrap();
    assert_eq!(timeline.makespan(), 9.0);
    assert_eq!(timeline.messages[0].start, 1.0);
    assert_eq!(timeline.messages[0].end, 2.5);
    // Rank 1 at speed 2 halves its F and B: arrives at 2.5, F to 3, B to 4, back at 5.5, B 7.5.
    let fast = cost.clone().with_rank_speed(vec![1.0, 2.0]);
    assert_eq!(simulate(&schedule, &fast).unwrap().makespan(), 7.5);
    // The single CommCost is ignored for messages when a network is given.
    let comm = CommCost {
        latency: 100.0,
        ..CommCost::FREE
    };
    let both = cost.with_comm(comm);
    assert_eq!(simulate(&schedule, &both).unwrap().makespan(), 9.0);
}

#[test]
fn a_network_for_other_ranks_and_bad_speeds_are_refused() {
    let schedule = build(ScheduleKind::OneFOneB, 2, 1, 1).unwrap();
    let net = topology(0.5).network(&[0], vec![10]).unwrap();
    let err = simulate(&schedule, &CostModel::default().with_network(net)).unwrap_err();
    assert!(err.to_string().contains("covers 1 ranks"), "{err}");
    let err = simulate(
        &schedule,
        &CostModel::default().with_rank_speed(vec![1.0, 0.0]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("speed of rank 1 = 0"), "{err}");
}
