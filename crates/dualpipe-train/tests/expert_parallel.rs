//! MoE over the data-parallel group, f64: two replicas with expert parallelism (each worker
//! computes its placed experts for both workers' tokens) train like two replicas without it
//! and like one replica on twice the micro-batches (the same global batch), to 1e-10, for
//! DualPipe, 1F1B, ZB1P and DualPipeV; EPLB re-placing the experts (with redundant slots)
//! changes no loss; the placement really moves the work between workers.

use dualpipe_train::{
    DataSection, ModelSection, OptimizerSection, ParallelismSection, ScheduleSection,
};
use std::collections::BTreeSet;

use dualpipe_nn::OptimizerKind;
use dualpipe_runtime::RankStages;
use dualpipe_schedule::ScheduleKind;
use dualpipe_train::checkpoint::{step_dir, Checkpoint};
use dualpipe_train::{
    CheckpointOptions, CheckpointWriter, DType, LocalReplicas, LocalThreads, ModelKind,
    MoeSettings, StepEvent, TrainConfig, Trainer,
};

const SCHEDULES: [ScheduleKind; 4] = [
    ScheduleKind::DualPipe,
    ScheduleKind::OneFOneB,
    ScheduleKind::Zb1p,
    ScheduleKind::DualPipeV,
];

/// A tiny MoE GPT on 2 ranks, f64, SGD with momentum, the selection bias moving.
fn tiny(kind: ScheduleKind, micro_batches: usize, moe: MoeSettings) -> TrainConfig {
    TrainConfig {
        model: ModelSection {
            kind: ModelKind::Gpt,
            layers_per_stage: 1,
            d_model: 16,
            heads: 2,
            seq_len: 8,
            dtype: DType::F64,
            moe: Some(moe),
            ..TrainConfig::defaults_for(ModelKind::Gpt).model
        },
        schedule: ScheduleSection::new(kind, 2, micro_batches, 2),
        optimizer: OptimizerSection {
            lr: 0.05,
            kind: OptimizerKind::Sgd { momentum: 0.9 },
            ..TrainConfig::defaults_for(ModelKind::Gpt).optimizer
        },
        data: DataSection {
            eval_every: 0,
            ..TrainConfig::defaults_for(ModelKind::Gpt).data
        },
        steps: 4,
        ..TrainConfig::defaults_for(ModelKind::Gpt)
    }
}

fn moe(expert_parallel: bool) -> MoeSettings {
    MoeSettings {
        experts: 4,
        top_k: 2,
        bias_update_rate: 0.01,
        expert_parallel,
        ..MoeSettings::DEFAULT
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-10 * a.abs().max(b.abs()).max(1.0)
}

fn losses_of(mut run: impl FnMut() -> Vec<f64>, steps: usize) -> Vec<Vec<f64>> {
    (0..steps).map(|_| run()).collect()
}

fn assert_same(what: &str, a: &[Vec<f64>], b: &[Vec<f64>]) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (step, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.len(), y.len(), "{what} step {step}");
        for (m, (p, q)) in x.iter().zip(y).enumerate() {
            assert!(
                close(*p, *q),
                "{what} step {step} micro-batch {m}: {p} vs {q}"
            );
        }
    }
    assert!(a.first() != a.last(), "{what}: the losses never moved");
}

#[test]
fn expert_parallel_losses_equal_the_same_global_batch_without_it() {
    for kind in SCHEDULES {
        let what = kind.to_string();
        let single = tiny(kind, 8, moe(false));
        let mut one = Trainer::new(single.clone()).unwrap();
        let reference = losses_of(|| one.step().unwrap().losses, single.steps);
        let dp = TrainConfig {
            schedule: ScheduleSection {
                micro_batches: 4,
                ..single.schedule.clone()
            },
            parallelism: ParallelismSection {
                data_parallel: 2,
                ..single.parallelism.clone()
            },
            ..single.clone()
        };
        let mut plain = LocalReplicas::new(dp.clone()).unwrap();
        let replicated = losses_of(|| plain.step().unwrap().losses, dp.steps);
        assert_same(&format!("{what}: D=2 vs D=1"), &replicated, &reference);
        let ep = TrainConfig {
            model: ModelSection {
                moe: Some(moe(true)),
                ..dp.model
            },
            ..dp
        };
        let mut parallel = LocalReplicas::new(ep.clone()).unwrap();
        let mut served = Vec::new();
        let spread = losses_of(
            || {
                let report = parallel.step().unwrap();
                served.push(report.expert_load.unwrap().worker_rows.unwrap());
                report.losses
            },
            ep.steps,
        );
        assert_same(
            &format!("{what}: expert-parallel vs D=1"),
            &spread,
            &reference,
        );
        // Every block's assignments were computed somewhere (dropless: 8 micro-batches of 2
        // sequences of 8 tokens, 2 experts each, both DualPipe copies together), and both
        // workers computed experts over the run: the rows were really spread.
        let mut per_worker = [0u64; 2];
        for rows in &served {
            for block in rows {
                assert_eq!(block.len(), 2, "{what}");
                assert_eq!(
                    block.iter().sum::<u64>(),
                    8 * 2 * 8 * 2,
                    "{what}: {block:?}"
                );
                per_worker[0] += block[0];
                per_worker[1] += block[1];
            }
        }
        assert!(per_worker.iter().all(|&r| r > 0), "{what}: {per_worker:?}");
    }
}

/// Per (MoE block, copy direction) of a replica's stages: the experts stored, and those its
/// placement gives the replica's worker.
fn stored_and_placed(t: &Trainer<LocalThreads>) -> Vec<(usize, Vec<usize>, Vec<usize>)> {
    let me = t.replica_index();
    let mut out = Vec::new();
    for (_, stage) in t.stages().iter().flat_map(RankStages::iter) {
        if let Some(g) = stage.as_gpt() {
            for (l, m) in g.moe_layers() {
                let placed = m.expert_parallel().map_or_else(
                    || (0..m.experts()).collect(),
                    |p| {
                        (0..m.experts())
                            .filter(|&j| p.placement().serves(me, j))
                            .collect()
                    },
                );
                out.push((l, m.stored_experts(), placed));
            }
        }
    }
    out.sort();
    out
}

/// Parameter bytes a replica's stages store (every copy), and those of its routed experts.
fn parameter_bytes(t: &Trainer<LocalThreads>) -> (usize, usize) {
    let mut all = 0;
    let mut experts = 0;
    for (_, stage) in t.stages().iter().flat_map(RankStages::iter) {
        for (name, p) in stage.param_names().iter().zip(stage.params()) {
            let bytes = p.value.elem_count() * p.value.dtype().size_in_bytes();
            all += bytes;
            if name.contains(".moe.experts.") {
                experts += bytes;
            }
        }
    }
    (all, experts)
}

/// Per (block, worker) of a group: the experts the worker stores (over its copies).
fn holdings(dp: &LocalReplicas) -> BTreeSet<(usize, usize, usize)> {
    let mut out = BTreeSet::new();
    for (d, t) in dp.replicas().iter().enumerate() {
        for (l, stored, _) in stored_and_placed(t) {
            out.extend(stored.into_iter().map(|j| (l, d, j)));
        }
    }
    out
}

#[test]
fn a_worker_stores_only_the_experts_its_placement_gives_it() {
    // 4 experts over 2 workers, DualPipe (two copies of every stage): each worker keeps 2.
    let kind = ScheduleKind::DualPipe;
    let plain = TrainConfig {
        parallelism: ParallelismSection {
            data_parallel: 2,
            ..(tiny(kind, 4, moe(false))).parallelism
        },
        ..tiny(kind, 4, moe(false))
    };
    let ep = TrainConfig {
        model: ModelSection {
            moe: Some(moe(true)),
            ..plain.model.clone()
        },
        ..plain.clone()
    };
    let dense = LocalReplicas::new(plain).unwrap();
    let sharded = LocalReplicas::new(ep).unwrap();
    let (before, before_experts) = parameter_bytes(&dense.replicas()[0]);
    for t in sharded.replicas() {
        for (l, stored, placed) in stored_and_placed(t) {
            assert_eq!(stored, placed, "block {l}: stored vs placed");
            assert_eq!(stored.len(), 2, "block {l}: E/D experts");
        }
        let (after, after_experts) = parameter_bytes(t);
        eprintln!(
            "replica {}: parameter bytes {before} -> {after} (routed experts {before_experts} \
             -> {after_experts})",
            t.replica_index()
        );
        assert_eq!(after_experts * 2, before_experts, "half the experts");
        assert_eq!(before - after, before_experts - after_experts);
    }
}

#[test]
fn eplb_with_redundant_experts_changes_no_loss() {
    for kind in [ScheduleKind::DualPipe, ScheduleKind::Zb1p] {
        let what = kind.to_string();
        let redundant = MoeSettings {
            redundant_experts: 2,
            ..moe(true)
        };
        let base = TrainConfig {
            parallelism: ParallelismSection {
                data_parallel: 2,
                ..(tiny(kind, 4, redundant)).parallelism
            },
            steps: 6,
            ..tiny(kind, 4, redundant)
        };
        let mut fixed = LocalReplicas::new(base.clone()).unwrap();
        let mut fixed_rows = Vec::new();
        let reference = losses_of(
            || {
                let r = fixed.step().unwrap();
                fixed_rows.push(r.expert_load.unwrap().worker_rows.unwrap());
                r.losses
            },
            base.steps,
        );
        let balanced = TrainConfig {
            model: ModelSection {
                moe: Some(MoeSettings {
                    eplb_every: 2,
                    ..redundant
                }),
                ..base.model.clone()
            },
            ..base.clone()
        };
        let mut moving = LocalReplicas::new(balanced.clone()).unwrap();
        let mut rows = Vec::new();
        // Expert copies a worker gained over the re-placements (each one transfer).
        let mut gained = 0;
        let rebalanced = losses_of(
            || {
                let held = holdings(&moving);
                let r = moving.step().unwrap();
                gained += holdings(&moving).difference(&held).count();
                for t in moving.replicas() {
                    for (l, stored, placed) in stored_and_placed(t) {
                        assert_eq!(stored, placed, "{what} step {}: block {l}", r.step);
                    }
                }
                rows.push(r.expert_load.unwrap().worker_rows.unwrap());
                r.losses
            },
            balanced.steps,
        );
        // Each transfer carries the expert's two [16·4/2 = 32, 16] weights and their SGD
        // momentum, f64.
        let per_expert = 2 * 32 * 16 * 2 * 8;
        let moved = moving.replicas()[0].expert_bytes_moved().unwrap();
        assert!(gained > 0, "{what}: some worker gained an expert");
        assert_eq!(moved, (gained * per_expert) as u64, "{what}: bytes moved");
        assert_same(&format!("{what}: EPLB vs fixed"), &rebalanced, &reference);
        assert_eq!(
            rows[..2],
            fixed_rows[..2],
            "{what}: the same placement until the first"
        );
        assert_ne!(
            rows, fixed_rows,
            "{what}: the re-placement changed who computes"
        );
        let summary = LocalReplicas::new(balanced)
            .unwrap()
            .run(|_| Ok(()))
            .unwrap();
        assert_eq!(summary.eplb_rebalances, Some(3), "{what}");
        assert!(summary.experts_moved.unwrap() > 0, "{what}");
        assert_eq!(summary.expert_bytes_moved, Some(moved), "{what}");
    }
}

#[test]
fn four_workers_with_a_few_replicated_experts_train_like_the_dense_exchange() {
    // 6 experts and 2 redundant slots over 4 workers: only some workers hold a replicated
    // expert, yet every worker joins the gradient sum's exchange (decided by the shared
    // placement, not by what a worker stores), so none waits for a peer that never sends.
    let config = |expert_parallel: bool, redundant_experts: usize, eplb_every: usize| TrainConfig {
        parallelism: ParallelismSection {
            data_parallel: 4,
            ..(tiny(
                ScheduleKind::DualPipe,
                2,
                MoeSettings {
                    experts: 6,
                    redundant_experts,
                    eplb_every,
                    ..moe(expert_parallel)
                },
            ))
            .parallelism
        },
        steps: 4,
        ..tiny(
            ScheduleKind::DualPipe,
            2,
            MoeSettings {
                experts: 6,
                redundant_experts,
                eplb_every,
                ..moe(expert_parallel)
            },
        )
    };
    let dense = config(false, 0, 0);
    let mut plain = LocalReplicas::new(dense.clone()).unwrap();
    let reference = losses_of(|| plain.step().unwrap().losses, dense.steps);
    let sharded = config(true, 2, 1);
    let mut parallel = LocalReplicas::new(sharded.clone()).unwrap();
    let spread = losses_of(|| parallel.step().unwrap().losses, sharded.steps);
    assert_same("4 workers, 2 redundant experts", &spread, &reference);
    let summary = LocalReplicas::new(sharded)
        .unwrap()
        .run(|_| Ok(()))
        .unwrap();
    assert!(summary.experts_moved.unwrap() > 0, "the experts moved");
}

#[test]
fn sharded_adamw_with_rebalancing_trains_like_the_dense_exchange() {
    // AdamW's two moments travel with a moved expert: the run with re-placements and
    // redundant experts equals two plain data-parallel replicas (every expert everywhere).
    let adamw = |m: MoeSettings| TrainConfig {
        parallelism: ParallelismSection {
            data_parallel: 2,
            ..(tiny(ScheduleKind::DualPipeV, 4, m)).parallelism
        },
        optimizer: OptimizerSection {
            kind: OptimizerKind::adamw(),
            lr: 0.01,
            ..(tiny(ScheduleKind::DualPipeV, 4, m)).optimizer
        },
        steps: 5,
        ..tiny(ScheduleKind::DualPipeV, 4, m)
    };
    let plain = adamw(moe(false));
    let mut reference = LocalReplicas::new(plain.clone()).unwrap();
    let expected = losses_of(|| reference.step().unwrap().losses, plain.steps);
    let sharded = adamw(MoeSettings {
        redundant_experts: 2,
        eplb_every: 2,
        ..moe(true)
    });
    let mut moving = LocalReplicas::new(sharded.clone()).unwrap();
    let got = losses_of(|| moving.step().unwrap().losses, sharded.steps);
    assert_same("AdamW, sharded with EPLB vs dense", &got, &expected);
    assert!(moving.replicas()[0].expert_bytes_moved().unwrap() > 0);
}

#[test]
fn clipping_with_sharded_experts_equals_the_dense_exchange() {
    // The global norm counts each sharded expert once (its lowest holder): the same norm, and
    // the same clipped steps, as two replicas that hold every expert.
    let clipped = |m: MoeSettings| TrainConfig {
        parallelism: ParallelismSection {
            data_parallel: 2,
            ..(tiny(ScheduleKind::DualPipe, 4, m)).parallelism
        },
        optimizer: OptimizerSection {
            clip_grad: Some(0.5),
            ..(tiny(ScheduleKind::DualPipe, 4, m)).optimizer
        },
        steps: 4,
        ..tiny(ScheduleKind::DualPipe, 4, m)
    };
    let run = |config: TrainConfig| {
        let mut dp = LocalReplicas::new(config.clone()).unwrap();
        let mut norms = Vec::new();
        let losses = losses_of(
            || {
                let r = dp.step().unwrap();
                norms.push(r.grad_norm.unwrap());
                r.losses
            },
            config.steps,
        );
        (losses, norms)
    };
    let (expected, dense_norms) = run(clipped(moe(false)));
    let (got, norms) = run(clipped(MoeSettings {
        redundant_experts: 2,
        eplb_every: 2,
        ..moe(true)
    }));
    assert_same("clipped, sharded vs dense", &got, &expected);
    for (a, b) in norms.iter().zip(&dense_norms) {
        assert!(close(*a, *b), "norm {a} vs {b}");
    }
    assert!(
        norms.iter().any(|&n| n > 0.5),
        "clipping was active: {norms:?}"
    );
}

/// A replica's parameter values, every copy of every stage: (stage, direction, name) ->
/// values, split into the dense ones and the routed experts it stores.
type Values = std::collections::BTreeMap<(usize, usize, String), Vec<f64>>;

fn dense_and_experts(t: &Trainer<LocalThreads>) -> (Values, Values) {
    let (mut dense, mut experts) = (Values::new(), Values::new());
    for (_, stage) in t.stages().iter().flat_map(RankStages::iter) {
        for (name, p) in stage.param_names().into_iter().zip(stage.params()) {
            let values = p.value.flatten_all().unwrap().to_vec1::<f64>().unwrap();
            let key = (stage.model_stage(), stage.dir(), name);
            match key.2.contains(".moe.experts.") {
                true => experts.insert(key, values),
                false => dense.insert(key, values),
            };
        }
    }
    (dense, experts)
}

#[test]
fn one_bit_adam_with_sharded_experts_keeps_holders_and_replicas_identical() {
    // 1-bit Adam (AdamW, 2 warm-up steps, 1bit) with redundant experts re-placed every 2
    // steps: the dense parameters follow 1-bit Adam (the compressed momentum, the same on
    // both replicas), the sharded experts plain AdamW on their exact sum among holders.
    let config = |compression, warmup| TrainConfig {
        parallelism: ParallelismSection {
            data_parallel: 2,
            gradient_compression: compression,
            compression_warmup: Some(warmup),
            ..(tiny(
                ScheduleKind::DualPipe,
                4,
                MoeSettings {
                    redundant_experts: 2,
                    eplb_every: 2,
                    ..moe(true)
                },
            ))
            .parallelism
        },
        optimizer: OptimizerSection {
            kind: OptimizerKind::adamw(),
            lr: 0.01,
            ..(tiny(
                ScheduleKind::DualPipe,
                4,
                MoeSettings {
                    redundant_experts: 2,
                    eplb_every: 2,
                    ..moe(true)
                },
            ))
            .optimizer
        },
        steps: 8,
        ..tiny(
            ScheduleKind::DualPipe,
            4,
            MoeSettings {
                redundant_experts: 2,
                eplb_every: 2,
                ..moe(true)
            },
        )
    };
    let one_bit = config(dualpipe_train::Compression::OneBit, 2);
    assert_eq!(one_bit.one_bit_adam_from(), Some(2));
    let mut dp = LocalReplicas::new(one_bit.clone()).unwrap();
    let mut losses = Vec::new();
    let mut replicated = 0;
    for step in 0..one_bit.steps {
        losses.push(dp.step().unwrap().loss);
        let [a, b] = dp.replicas() else {
            panic!("two replicas")
        };
        let ((dense_a, experts_a), (dense_b, experts_b)) =
            (dense_and_experts(a), dense_and_experts(b));
        assert!(!dense_a.is_empty());
        assert_eq!(
            dense_a, dense_b,
            "step {step}: the replicas' dense parameters"
        );
        // An expert both workers hold (a redundant slot) is the same on both, bit for bit.
        for (key, values) in &experts_a {
            if let Some(other) = experts_b.get(key) {
                assert_eq!(values, other, "step {step}: {key:?} on its two holders");
                replicated += 1;
            }
        }
    }
    assert!(replicated > 0, "some expert had two holders");
    assert!(losses.iter().all(|l| l.is_finite()));
    assert!(
        losses[losses.len() - 1] < losses[0],
        "the losses decrease: {losses:?}"
    );
    // The warm-up is AdamW on the gradient exchanged in int8, close to the uncompressed
    // exchange; afterwards 1-bit Adam differs.
    let mut plain = LocalReplicas::new(config(dualpipe_train::Compression::None, 2)).unwrap();
    let reference: Vec<f64> = (0..one_bit.steps)
        .map(|_| plain.step().unwrap().loss)
        .collect();
    assert_eq!(
        losses[0], reference[0],
        "the first loss comes before any update"
    );
    for (step, (l, r)) in losses.iter().zip(&reference).enumerate().take(3).skip(1) {
        let gap = (l - r).abs() / r.abs();
        assert!(
            gap < 1e-2,
            "warm-up step {step}: {losses:?} vs {reference:?}"
        );
    }
    assert_ne!(losses[3..], reference[3..], "1-bit Adam from step 3");
}

#[test]
fn placement_flags_without_expert_parallelism_are_refused() {
    let config = TrainConfig {
        model: ModelSection {
            moe: Some(MoeSettings {
                eplb_every: 5,
                ..moe(false)
            }),
            ..(tiny(ScheduleKind::OneFOneB, 4, moe(false))).model
        },
        parallelism: ParallelismSection {
            data_parallel: 2,
            ..(tiny(ScheduleKind::OneFOneB, 4, moe(false))).parallelism
        },
        ..tiny(ScheduleKind::OneFOneB, 4, moe(false))
    };
    let err = LocalReplicas::new(config).unwrap_err().to_string();
    assert!(
        err.contains("moe.eplb_every") && err.contains("expert_parallel"),
        "{err}"
    );
    let config = TrainConfig {
        model: ModelSection {
            moe: Some(MoeSettings {
                redundant_experts: 1,
                ..moe(true)
            }),
            ..(tiny(ScheduleKind::OneFOneB, 4, moe(false))).model
        },
        parallelism: ParallelismSection {
            data_parallel: 2,
            ..(tiny(ScheduleKind::OneFOneB, 4, moe(false))).parallelism
        },
        ..tiny(ScheduleKind::OneFOneB, 4, moe(false))
    };
    let err = LocalReplicas::new(config).unwrap_err().to_string();
    assert!(err.contains("multiple of 2"), "{err}");
}

#[test]
fn the_overlapped_fb_pair_gives_the_losses_of_the_sequential_one() {
    // DualPipe on 2 ranks with 4 micro-batches has overlapped FB pairs; the emulated link
    // (2 ms a message) makes one chunk wait on its all-to-all while the other computes.
    let kind = ScheduleKind::DualPipe;
    let schedule = dualpipe_schedule::build(kind, 2, 4, kind.default_virtual_stages()).unwrap();
    let pairs = schedule
        .programs
        .iter()
        .flatten()
        .filter(|op| matches!(op, dualpipe_schedule::Op::FB { .. }))
        .count();
    assert!(pairs > 0, "the schedule has no FB pair to overlap");
    let run = |overlap: bool| {
        let config = TrainConfig {
            parallelism: ParallelismSection {
                data_parallel: 2,
                ..(tiny(
                    kind,
                    4,
                    MoeSettings {
                        link_latency: 0.002,
                        overlap,
                        ..moe(true)
                    },
                ))
                .parallelism
            },
            steps: 3,
            ..tiny(
                kind,
                4,
                MoeSettings {
                    link_latency: 0.002,
                    overlap,
                    ..moe(true)
                },
            )
        };
        let mut dp = LocalReplicas::new(config.clone()).unwrap();
        losses_of(|| dp.step().unwrap().losses, config.steps)
    };
    let overlapped = run(true);
    let sequential = run(false);
    assert_eq!(overlapped, sequential, "bit-identical losses");
    assert!(overlapped.first() != overlapped.last(), "the losses moved");
}

#[test]
fn link_flags_are_checked() {
    let with = |m: MoeSettings| TrainConfig {
        parallelism: ParallelismSection {
            data_parallel: 2,
            ..(tiny(ScheduleKind::DualPipe, 4, m)).parallelism
        },
        ..tiny(ScheduleKind::DualPipe, 4, m)
    };
    let err = LocalReplicas::new(with(MoeSettings {
        link_latency: 0.001,
        ..moe(false)
    }))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("moe.link_latency") && err.contains("expert_parallel"),
        "{err}"
    );
    let err = LocalReplicas::new(with(MoeSettings {
        link_bandwidth: Some(-5.0),
        ..moe(true)
    }))
    .unwrap_err()
    .to_string();
    assert!(err.contains("moe.link_bandwidth -5"), "{err}");
    let err = LocalReplicas::new(with(MoeSettings {
        link_latency: f64::NAN,
        ..moe(true)
    }))
    .unwrap_err()
    .to_string();
    assert!(err.contains("moe.link_latency NaN"), "{err}");
}

#[test]
fn a_sharded_checkpoint_resumes_bit_identically_and_on_another_shape() {
    // Re-placements after steps 2 and 4; the checkpoint after step 3 holds every expert
    // (each written by one holder), the placement of version 2 and the moving average.
    let config = TrainConfig {
        parallelism: ParallelismSection {
            data_parallel: 2,
            ..(tiny(
                ScheduleKind::DualPipe,
                4,
                MoeSettings {
                    redundant_experts: 2,
                    eplb_every: 2,
                    ..moe(true)
                },
            ))
            .parallelism
        },
        steps: 6,
        ..tiny(
            ScheduleKind::DualPipe,
            4,
            MoeSettings {
                redundant_experts: 2,
                eplb_every: 2,
                ..moe(true)
            },
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let options = CheckpointOptions {
        every: 3,
        keep: 0,
        ..CheckpointOptions::new(dir.path())
    };
    let writer = CheckpointWriter::start(&options, 2).unwrap();
    let mut whole = LocalReplicas::new(config.clone()).unwrap();
    whole.set_checkpoints(&writer);
    let mut expected = Vec::new();
    whole
        .run(|event| {
            if let StepEvent::Finished { report, .. } = event {
                expected.push(report.losses.clone());
            }
            Ok(())
        })
        .unwrap();
    whole.clear_checkpoints();
    writer.finish().unwrap();
    let ckpt = Checkpoint::read(&step_dir(dir.path(), 3)).unwrap();
    for l in [0, 1] {
        for j in 0..4 {
            assert!(
                ckpt.tensors
                    .contains_key(&format!("blocks.{l}.moe.experts.{j}.fc1.weight")),
                "block {l} expert {j} saved"
            );
        }
        let version = ckpt
            .tensor(&format!("blocks.{l}.moe.placement.version"))
            .unwrap()
            .to_f64s();
        assert_eq!(
            version,
            vec![2.0],
            "block {l}: the placement of the first rebalance"
        );
    }
    let mut resumed = LocalReplicas::new(config.clone()).unwrap();
    resumed.restore(&ckpt).unwrap();
    for t in resumed.replicas() {
        for (l, stored, placed) in stored_and_placed(t) {
            assert_eq!(stored, placed, "resumed block {l}");
        }
    }
    let got = losses_of(|| resumed.step().unwrap().losses, 3);
    assert_eq!(got, expected[3..], "the resumed losses, bit for bit");
    // Without expert parallelism (every expert on every worker) the same model goes on.
    let plain = TrainConfig {
        model: ModelSection {
            moe: Some(moe(false)),
            ..config.model
        },
        ..config
    };
    let mut other = LocalReplicas::new(plain).unwrap();
    other.restore(&ckpt).unwrap();
    let got = losses_of(|| other.step().unwrap().losses, 3);
    assert_same("resumed without expert parallelism", &got, &expected[3..]);
}

/// `ranks x 2` workers, each a thread with its own one-rank trainer as an MPI process would be
/// (`dualpipe_train::job::process_grid::mpi_trainer`): each replica's pipeline on in-memory links, each held
/// stage's gradients over our exchange with its holder in the other replica, and the expert
/// links of each pipeline rank over both replicas (as `dualpipe_train::parallel::experts::mpi` builds
/// them, here in process). Per worker, per step: the micro-batch losses, the gradient norm,
/// and the expert load's rows per worker.
#[allow(clippy::type_complexity)]
fn one_rank_per_thread(config: &TrainConfig) -> Vec<Vec<(Vec<f64>, Option<f64>, Vec<u64>)>> {
    use dualpipe_dp::ChannelTransport;
    use dualpipe_runtime::transport::endpoint::ChannelLink;
    use dualpipe_runtime::Endpoint;
    use dualpipe_train::parallel::experts::group::links_for;
    use dualpipe_train::{GroupLink, OneRank, ReplicaLinks};

    let (ranks, replicas) = (config.schedule.ranks, config.parallelism.data_parallel);
    let placement = config.build_schedule().unwrap().placement;
    let held = |r: usize| {
        let mut stages: Vec<usize> = placement.stages_of(r).into_iter().map(|(_, s)| s).collect();
        stages.sort_unstable();
        stages.dedup();
        stages
    };
    let mut workers = Vec::new();
    let mut per_rank: Vec<_> = (0..ranks)
        .map(|p| {
            let stages: Vec<_> = held(p)
                .into_iter()
                .map(|s| (s, ChannelTransport::group(replicas).into_iter()))
                .collect();
            let losses = ChannelTransport::group(replicas).into_iter();
            (stages, losses, links_for(config, replicas).into_iter())
        })
        .collect();
    for replica in 0..replicas {
        for (p, link) in ChannelLink::world(ranks).into_iter().enumerate() {
            let (stages, losses, experts) = &mut per_rank[p];
            let links = ReplicaLinks {
                replica,
                replicas,
                stages: stages
                    .iter_mut()
                    .map(|(s, g)| (*s, GroupLink::Messages(Box::new(g.next().unwrap()))))
                    .collect(),
                losses: Box::new(losses.next().unwrap()),
            };
            workers.push((replica, link, links, experts.next().unwrap()));
        }
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = workers
            .into_iter()
            .map(|(replica, link, links, experts)| {
                let config = config.clone();
                scope.spawn(move || {
                    let driver = OneRank::new(Endpoint::new(link));
                    let mut trainer =
                        Trainer::for_replica(config.clone(), None, driver, links).unwrap();
                    trainer.join_expert_group(replica, experts).unwrap();
                    (0..config.steps)
                        .map(|_| {
                            let r = trainer.step().unwrap();
                            let load = r.expert_load.unwrap();
                            let rows = load.worker_rows.unwrap_or_default();
                            (r.losses, r.grad_norm, rows.into_iter().flatten().collect())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn one_rank_per_process_trains_like_the_local_run() {
    // What MPI runs, on threads: the router counts and rows of DualPipe's two copies meet
    // across ranks, the norm adds every rank's sharded experts, EPLB moves experts between
    // the ranks' groups; every worker's losses, norms and rows equal the local run's.
    for kind in [ScheduleKind::DualPipe, ScheduleKind::OneFOneB] {
        let config = TrainConfig {
            parallelism: ParallelismSection {
                data_parallel: 2,
                ..(tiny(
                    kind,
                    4,
                    MoeSettings {
                        redundant_experts: 2,
                        eplb_every: 2,
                        ..moe(true)
                    },
                ))
                .parallelism
            },
            optimizer: OptimizerSection {
                clip_grad: Some(0.5),
                ..(tiny(
                    kind,
                    4,
                    MoeSettings {
                        redundant_experts: 2,
                        eplb_every: 2,
                        ..moe(true)
                    },
                ))
                .optimizer
            },
            steps: 4,
            ..tiny(
                kind,
                4,
                MoeSettings {
                    redundant_experts: 2,
                    eplb_every: 2,
                    ..moe(true)
                },
            )
        };
        let mut local = LocalReplicas::new(config.clone()).unwrap();
        let expected: Vec<_> = (0..config.steps)
            .map(|_| {
                let r = local.step().unwrap();
                let rows = r.expert_load.unwrap().worker_rows.unwrap();
                (
                    r.losses,
                    r.grad_norm,
                    rows.into_iter().flatten().collect::<Vec<u64>>(),
                )
            })
            .collect();
        for (w, steps) in one_rank_per_thread(&config).into_iter().enumerate() {
            assert_eq!(steps.len(), expected.len());
            for (step, ((losses, norm, rows), (want, want_norm, want_rows))) in
                steps.into_iter().zip(&expected).enumerate()
            {
                let what = format!("{kind}, worker {w}, step {step}");
                // The losses bit for bit; the norm adds the ranks' expert squares in another
                // order (to rounding).
                assert_eq!(&losses, want, "{what}");
                assert!(close(norm.unwrap(), want_norm.unwrap()), "{what}: {norm:?}");
                assert_eq!(&rows, want_rows, "{what}");
            }
        }
        let (_, moved, _) = local.replicas()[0].rebalance_totals().unwrap();
        assert!(moved > 0, "{kind}: EPLB moved no expert");
    }
}
