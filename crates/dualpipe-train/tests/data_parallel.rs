//! Data parallelism: `data_parallel 2` trains like one replica on twice the micro-batches
//! (the same global batch), per step and per micro-batch, to 1e-12 relative in f64 without
//! compression, for DualPipe, 1F1B, ZB1P and DualPipeV, the MLP and the GPT; the exchange's
//! byte counts; the configuration's checks.

use dualpipe_dp::Compression;
use dualpipe_nn::OptimizerKind;
use dualpipe_schedule::ScheduleKind;
use dualpipe_train::{DType, LocalReplicas, ModelKind, TrainConfig, Trainer};
use dualpipe_train::{
    DataSection, ModelSection, OptimizerSection, ParallelismSection, ScheduleSection,
};

const SCHEDULES: [ScheduleKind; 4] = [
    ScheduleKind::DualPipe,
    ScheduleKind::OneFOneB,
    ScheduleKind::Zb1p,
    ScheduleKind::DualPipeV,
];

/// A tiny run of `model` on 2 ranks, f64, SGD with momentum (its state matters from the
/// second step on).
fn tiny(model: ModelKind, kind: ScheduleKind, micro_batches: usize) -> TrainConfig {
    TrainConfig {
        model: ModelSection {
            kind: model,
            hidden: 8,
            layers_per_stage: 1,
            d_model: 16,
            heads: 2,
            seq_len: 8,
            dtype: DType::F64,
            ..TrainConfig::defaults_for(model).model
        },
        schedule: ScheduleSection::new(kind, 2, micro_batches, 2),
        optimizer: OptimizerSection {
            lr: 0.05,
            kind: OptimizerKind::Sgd { momentum: 0.9 },
            ..TrainConfig::defaults_for(model).optimizer
        },
        data: DataSection {
            eval_every: 0,
            ..TrainConfig::defaults_for(model).data
        },
        steps: 4,
        ..TrainConfig::defaults_for(model)
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1e-300)
}

/// Steps `config` with one replica on `2 M` micro-batches and with two replicas on `M` each,
/// comparing every step's micro-batch losses and step loss.
fn two_replicas_equal_one_with_twice_the_micro_batches(single: TrainConfig) {
    let mut one = Trainer::new(single.clone()).unwrap();
    let halved = TrainConfig {
        schedule: ScheduleSection {
            micro_batches: single.schedule.micro_batches / 2,
            ..single.schedule.clone()
        },
        parallelism: ParallelismSection {
            data_parallel: 2,
            ..single.parallelism.clone()
        },
        ..single.clone()
    };
    let mut two = LocalReplicas::new(halved).unwrap();
    let what = format!("{} {}", single.model.kind.name(), single.schedule.kind);
    let mut first = None;
    let mut last = 0.0;
    for step in 0..single.steps {
        let a = one.step().unwrap();
        let b = two.step().unwrap();
        assert_eq!(a.losses.len(), b.losses.len(), "{what} step {step}");
        for (m, (x, y)) in a.losses.iter().zip(&b.losses).enumerate() {
            assert!(
                close(*x, *y),
                "{what} step {step} micro-batch {m}: {x} vs {y}"
            );
        }
        assert!(
            close(a.loss, b.loss),
            "{what} step {step}: {} vs {}",
            a.loss,
            b.loss
        );
        first.get_or_insert(a.loss);
        last = a.loss;
    }
    // The optimizer steps mattered: the later losses depend on the exchanged gradients.
    assert!(first != Some(last), "{what}: the loss never moved");
    // Every replica ends with the same weights, bit for bit.
    let reference = two.replicas()[0].parameters();
    for replica in &two.replicas()[1..] {
        for (p, q) in reference
            .iter()
            .flatten()
            .zip(replica.parameters().iter().flatten())
        {
            let (p, q) = (
                dualpipe_nn::stage::to_f64_vec(p).unwrap(),
                dualpipe_nn::stage::to_f64_vec(q).unwrap(),
            );
            assert!(
                p.iter().zip(&q).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{what}"
            );
        }
    }
}

#[test]
fn mlp_two_replicas_match_one_replica_on_the_same_global_batch() {
    for kind in SCHEDULES {
        two_replicas_equal_one_with_twice_the_micro_batches(tiny(ModelKind::Mlp, kind, 8));
    }
}

#[test]
fn gpt_two_replicas_match_one_replica_on_the_same_global_batch() {
    for kind in SCHEDULES {
        two_replicas_equal_one_with_twice_the_micro_batches(tiny(ModelKind::Gpt, kind, 8));
    }
}

#[test]
fn one_micro_batch_per_replica_runs_to_its_summary() {
    // The losses' exchange (2 replicas x 1 micro-batch) also carries the run's four summed
    // figures at the end: it is sized for both.
    let single = tiny(ModelKind::Gpt, ScheduleKind::OneFOneB, 2);
    two_replicas_equal_one_with_twice_the_micro_batches(single.clone());
    let halved = TrainConfig {
        schedule: ScheduleSection {
            micro_batches: 1,
            ..single.schedule
        },
        parallelism: ParallelismSection {
            data_parallel: 2,
            ..single.parallelism
        },
        ..single
    };
    let summary = LocalReplicas::new(halved).unwrap().run(|_| Ok(())).unwrap();
    assert_eq!(summary.losses.len(), 4);
    assert!(summary.grad_bytes_sent > 0);
}

#[test]
fn without_overlap_the_losses_are_the_same_bits() {
    let config = TrainConfig {
        parallelism: ParallelismSection {
            data_parallel: 2,
            ..(tiny(ModelKind::Mlp, ScheduleKind::DualPipe, 4)).parallelism
        },
        ..tiny(ModelKind::Mlp, ScheduleKind::DualPipe, 4)
    };
    let overlapped = LocalReplicas::new(config.clone())
        .unwrap()
        .run(|_| Ok(()))
        .unwrap();
    let plain = LocalReplicas::new(TrainConfig {
        parallelism: ParallelismSection {
            overlap: false,
            ..config.parallelism
        },
        ..config
    })
    .unwrap()
    .run(|_| Ok(()))
    .unwrap();
    assert_eq!(overlapped.losses, plain.losses);
    assert_eq!(overlapped.grad_bytes_sent, plain.grad_bytes_sent);
}

/// Compressed (int8, error feedback) and one copy per stage (1F1B): starting the exchange
/// inside the pipeline changes no bit either.
#[test]
fn without_overlap_a_compressed_run_is_the_same_bits() {
    for kind in [ScheduleKind::DualPipe, ScheduleKind::OneFOneB] {
        let config = TrainConfig {
            parallelism: ParallelismSection {
                data_parallel: 2,
                gradient_compression: Compression::Int8,
                ..(tiny(ModelKind::Mlp, kind, 4)).parallelism
            },
            ..tiny(ModelKind::Mlp, kind, 4)
        };
        let run =
            |config: TrainConfig| LocalReplicas::new(config).unwrap().run(|_| Ok(())).unwrap();
        let overlapped = run(config.clone());
        let plain = run(TrainConfig {
            parallelism: ParallelismSection {
                overlap: false,
                ..config.parallelism
            },
            ..config
        });
        assert_eq!(overlapped.losses, plain.losses, "{kind}");
        assert_eq!(overlapped.grad_bytes_sent, plain.grad_bytes_sent, "{kind}");
    }
}

/// With overlap every model stage's exchange starts inside the pipeline (from the
/// executor's hook, once all of the stage's copies have run their last weight-gradient op),
/// once per stage per step, compressed or not; with `--no-overlap`, or under 1-bit Adam
/// (whose momentum is folded after the pipeline), none does.
#[test]
fn the_exchange_starts_inside_the_pipeline_once_per_stage() {
    for kind in SCHEDULES {
        let config = TrainConfig {
            parallelism: ParallelismSection {
                data_parallel: 2,
                ..(tiny(ModelKind::Mlp, kind, 4)).parallelism
            },
            steps: 2,
            ..tiny(ModelKind::Mlp, kind, 4)
        };
        let started = |config: TrainConfig| -> Vec<usize> {
            let mut dp = LocalReplicas::new(config).unwrap();
            (0..2)
                .map(|_| dp.step().unwrap().exchange.unwrap().started_in_pipeline)
                .collect()
        };
        let stages = config.model_stages();
        assert_eq!(started(config.clone()), vec![stages; 2], "{kind}");
        let int8 = TrainConfig {
            parallelism: ParallelismSection {
                gradient_compression: Compression::Int8,
                ..config.parallelism.clone()
            },
            ..config.clone()
        };
        assert_eq!(started(int8), vec![stages; 2], "{kind} int8");
        let plain = TrainConfig {
            parallelism: ParallelismSection {
                overlap: false,
                ..config.parallelism.clone()
            },
            ..config.clone()
        };
        assert_eq!(started(plain), vec![0; 2], "{kind} --no-overlap");
        let one_bit_adam = TrainConfig {
            parallelism: ParallelismSection {
                gradient_compression: Compression::OneBit,
                compression_warmup: Some(1),
                ..config.parallelism
            },
            optimizer: OptimizerSection {
                kind: OptimizerKind::adamw(),
                ..config.optimizer
            },
            ..config
        };
        assert_eq!(started(one_bit_adam), vec![0; 2], "{kind} 1-bit Adam");
    }
}

/// 1-bit Adam (1bit, AdamW, a warm-up): the replicas exchange the momentum after the warm-up
/// and stay bit-identical; it trains differently from compressing the gradient (no warm-up),
/// and the warm-up steps are those of a run exchanging the gradient in int8 without error
/// feedback. The same with the preconditioned momentum (`one_bit_preconditioned`), which
/// trains differently again. A variance refresh every 2 steps changes nothing before its first
/// refresh (step 4) and the steps after it, and keeps the replicas identical.
#[test]
fn one_bit_adam_keeps_the_replicas_identical_and_its_warmup_is_int8() {
    let run_with = |compression: Compression, warmup: u64, preconditioned: bool, refresh: u64| {
        let config = TrainConfig {
            parallelism: ParallelismSection {
                data_parallel: 2,
                gradient_compression: compression,
                compression_warmup: Some(warmup),
                one_bit_preconditioned: preconditioned,
                variance_refresh: Some(refresh),
                error_feedback: compression == Compression::OneBit,
                ..(tiny(ModelKind::Gpt, ScheduleKind::DualPipe, 4)).parallelism
            },
            optimizer: OptimizerSection {
                kind: OptimizerKind::adamw(),
                lr: 0.01,
                ..(tiny(ModelKind::Gpt, ScheduleKind::DualPipe, 4)).optimizer
            },
            steps: 6,
            ..tiny(ModelKind::Gpt, ScheduleKind::DualPipe, 4)
        };
        assert_eq!(
            config.one_bit_adam_from().is_some(),
            warmup > 0 && compression == Compression::OneBit
        );
        let mut dp = LocalReplicas::new(config).unwrap();
        let losses: Vec<f64> = (0..6).map(|_| dp.step().unwrap().loss).collect();
        let [a, b] = dp.replicas() else {
            panic!("two replicas")
        };
        let values = |t: &Trainer<_>| -> Vec<Vec<f64>> {
            let flat = |p: &candle_core::Tensor| p.flatten_all().unwrap().to_vec1::<f64>().unwrap();
            t.parameters().iter().flatten().map(flat).collect()
        };
        assert_eq!(values(a), values(b), "the replicas' weights");
        losses
    };
    let run = |compression, warmup| run_with(compression, warmup, false, 0);
    let adam = run(Compression::OneBit, 2);
    let preconditioned = run_with(Compression::OneBit, 2, true, 0);
    assert_eq!(adam[..3], preconditioned[..3]);
    assert_ne!(adam[3..], preconditioned[3..]);
    let refreshed = run_with(Compression::OneBit, 2, false, 2);
    assert_eq!(adam[..4], refreshed[..4], "no refresh before step 4");
    assert_ne!(adam[4..], refreshed[4..], "step 4 refreshed the variance");
    let gradients = run(Compression::OneBit, 0);
    let int8 = run(Compression::Int8, 0);
    assert!(adam.iter().all(|l| l.is_finite()));
    assert_eq!(
        adam[..3],
        int8[..3],
        "steps 1-2 exchange the gradient in int8, step 3's loss is theirs"
    );
    assert_ne!(adam[3..], int8[3..]);
    assert_ne!(adam[3..], gradients[3..]);
}

#[test]
fn the_transport_counts_fewer_bytes_for_each_compression() {
    let mut sent = Vec::new();
    for compression in Compression::ALL {
        let config = TrainConfig {
            model: ModelSection {
                dtype: DType::F32,
                ..(tiny(ModelKind::Gpt, ScheduleKind::DualPipe, 4)).model
            },
            parallelism: ParallelismSection {
                data_parallel: 2,
                gradient_compression: compression,
                ..(tiny(ModelKind::Gpt, ScheduleKind::DualPipe, 4)).parallelism
            },
            steps: 3,
            ..tiny(ModelKind::Gpt, ScheduleKind::DualPipe, 4)
        };
        let summary = LocalReplicas::new(config).unwrap().run(|_| Ok(())).unwrap();
        assert!(
            summary.losses.iter().all(|l| l.is_finite()),
            "{compression}"
        );
        assert!(summary.grad_bytes_uncompressed > 0);
        assert_eq!(summary.data_parallel, 2);
        assert_eq!(summary.gradient_compression, compression.name());
        sent.push((summary.grad_bytes_sent, summary.grad_bytes_uncompressed));
        let json = summary.json();
        for key in [
            "grad_bytes_sent",
            "grad_bytes_uncompressed",
            "communication_overhead",
        ] {
            assert!(json.contains(key), "{key} in {json}");
        }
        assert!(summary.table(true).contains("communication overhead"));
        // The residual's norm after every step: what a lossy compression still owes (SGD:
        // compressed from the first step, no warm-up).
        match compression {
            Compression::None => assert!(summary.feedback_norms.is_empty()),
            _ => {
                assert_eq!(summary.feedback_norms.len(), 3, "{compression}");
                assert!(
                    summary.feedback_norms.iter().all(|n| *n > 0.0),
                    "{compression}: {:?}",
                    summary.feedback_norms
                );
                assert_eq!(summary.compression_warmup, Some(0));
                assert!(json.contains("feedback_norms"));
            }
        }
    }
    // The uncompressed figure is the same for every run; what is sent shrinks.
    assert!(sent.iter().all(|s| s.1 == sent[0].1));
    assert_eq!(sent[0].0, sent[0].1, "none sends the values themselves");
    assert!(sent[1].0 * 2 <= sent[0].0 + 64, "bf16 halves f32: {sent:?}");
    assert!(sent[2].0 < sent[1].0 && sent[3].0 < sent[2].0, "{sent:?}");
}

#[test]
fn a_single_trainer_refuses_several_replicas_and_sizes_are_checked() {
    let config = TrainConfig {
        parallelism: ParallelismSection {
            data_parallel: 2,
            ..(tiny(ModelKind::Mlp, ScheduleKind::DualPipe, 4)).parallelism
        },
        ..tiny(ModelKind::Mlp, ScheduleKind::DualPipe, 4)
    };
    let err = Trainer::new(config.clone()).unwrap_err().to_string();
    assert!(err.contains("LocalReplicas"), "{err}");
    for bad in [
        TrainConfig {
            parallelism: ParallelismSection {
                data_parallel: 0,
                ..config.parallelism.clone()
            },
            ..config.clone()
        },
        TrainConfig {
            parallelism: ParallelismSection {
                bucket_mb: 0.0,
                ..config.parallelism.clone()
            },
            ..config.clone()
        },
        TrainConfig {
            parallelism: ParallelismSection {
                bucket_mb: f64::NAN,
                ..config.parallelism.clone()
            },
            ..config.clone()
        },
    ] {
        assert!(LocalReplicas::new(bad).is_err());
    }
    // One replica through LocalReplicas is the plain trainer, bit for bit.
    let one = TrainConfig {
        parallelism: ParallelismSection {
            data_parallel: 1,
            ..config.parallelism
        },
        ..config
    };
    let a = LocalReplicas::new(one.clone())
        .unwrap()
        .run(|_| Ok(()))
        .unwrap();
    let b = Trainer::new(one).unwrap().run(|_| Ok(())).unwrap();
    assert_eq!(a.losses, b.losses);
    assert_eq!(a.grad_bytes_sent, 0);
}

/// How the one-rank-per-thread workers exchange each model stage's gradients.
#[derive(Clone, Copy, PartialEq)]
enum Groups {
    /// One in-process all-reduce group (`ThreadSum`) over every holder of a copy of the
    /// stage in every replica — DualPipe's two copies both join, `2 D` members — as under MPI
    /// without compression.
    LibrarySum,
    /// Our point-to-point exchange, as under MPI compressed: DualPipe's copy holders of a
    /// stage in one replica joined by their own group, the holder of direction 0's copy
    /// leading the replicas' exchange (`GroupLink::Lead`, `GroupLink::Partner`).
    Ours,
}

/// `ranks x 2` workers, each a thread with its own one-rank trainer as an MPI process would
/// be (the pipeline of each replica on in-memory links), each model stage's gradients
/// exchanged by `groups`. Per step: the losses, and how many stage exchanges started inside
/// the pipeline, of every worker.
fn one_rank_per_thread(config: &TrainConfig, groups: Groups) -> Vec<Vec<(f64, usize)>> {
    use dualpipe_dp::{ChannelTransport, ThreadSum};
    use dualpipe_runtime::transport::endpoint::ChannelLink;
    use dualpipe_runtime::Endpoint;
    use dualpipe_train::{GroupLink, OneRank, ReplicaLinks};

    let (ranks, replicas) = (config.schedule.ranks, config.parallelism.data_parallel);
    let placement = config.build_schedule().unwrap().placement;
    let held = |r: usize| {
        let mut stages: Vec<usize> = placement.stages_of(r).into_iter().map(|(_, s)| s).collect();
        stages.sort_unstable();
        stages
    };
    let mut sums: Vec<_> = (0..config.model_stages())
        .map(|s| {
            let copies = (0..ranks).filter(|&r| held(r).contains(&s)).count();
            ThreadSum::<f64>::group(copies * replicas).into_iter()
        })
        .collect();
    // Ours: per stage, the leads' group over the replicas, and per replica the copy holders'.
    let holders = |s: usize| -> Vec<usize> {
        (0..placement.dirs())
            .map(|d| placement.rank(d, s))
            .collect()
    };
    let mut leads: Vec<_> = (0..config.model_stages())
        .map(|_| ChannelTransport::group(replicas).into_iter())
        .collect();
    let mut losses: Vec<_> = (0..ranks)
        .map(|_| ChannelTransport::group(replicas).into_iter())
        .collect();
    let mut workers = Vec::new();
    for replica in 0..replicas {
        let mut copies: Vec<Vec<Option<ChannelTransport>>> = (0..config.model_stages())
            .map(|s| {
                ChannelTransport::group(holders(s).len())
                    .into_iter()
                    .map(Some)
                    .collect()
            })
            .collect();
        for (p, link) in ChannelLink::world(ranks).into_iter().enumerate() {
            let stages = held(p)
                .into_iter()
                .map(|s| {
                    let member = holders(s).iter().position(|&h| h == p).unwrap();
                    let pair = copies[s][member].take().unwrap();
                    let g = match groups {
                        Groups::LibrarySum => GroupLink::SumF64(Box::new(sums[s].next().unwrap())),
                        Groups::Ours if member == 0 => GroupLink::Lead {
                            replicas: Box::new(leads[s].next().unwrap()),
                            copies: Box::new(pair),
                        },
                        Groups::Ours => GroupLink::Partner(Box::new(pair)),
                    };
                    (s, g)
                })
                .collect();
            let links = ReplicaLinks {
                replica,
                replicas,
                stages,
                losses: Box::new(losses[p].next().unwrap()),
            };
            workers.push((link, links));
        }
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = workers
            .into_iter()
            .map(|(link, links)| {
                let config = config.clone();
                scope.spawn(move || {
                    let driver = OneRank::new(Endpoint::new(link));
                    let mut trainer =
                        Trainer::for_replica(config.clone(), None, driver, links).unwrap();
                    (0..config.steps)
                        .map(|_| {
                            let report = trainer.step().unwrap();
                            (report.loss, report.exchange.unwrap().started_in_pipeline)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn one_rank_per_process_on_a_library_sum_matches_the_local_run_inside_the_pipeline() {
    for kind in [ScheduleKind::DualPipe, ScheduleKind::OneFOneB] {
        let config = TrainConfig {
            schedule: ScheduleSection {
                ranks: 4,
                micro_batches: 8,
                ..(tiny(ModelKind::Mlp, kind, 8)).schedule
            },
            parallelism: ParallelismSection {
                data_parallel: 2,
                ..(tiny(ModelKind::Mlp, kind, 8)).parallelism
            },
            steps: 3,
            ..tiny(ModelKind::Mlp, kind, 8)
        };
        let mut local = LocalReplicas::new(config.clone()).unwrap();
        let expected: Vec<f64> = (0..config.steps)
            .map(|_| local.step().unwrap().loss)
            .collect();
        let placement = config.build_schedule().unwrap().placement;
        for (w, steps) in one_rank_per_thread(&config, Groups::LibrarySum)
            .into_iter()
            .enumerate()
        {
            let mut held: Vec<usize> = placement
                .stages_of(w % config.schedule.ranks)
                .into_iter()
                .map(|(_, s)| s)
                .collect();
            held.dedup();
            for (step, ((loss, started), want)) in steps.into_iter().zip(&expected).enumerate() {
                // 1F1B: two members, `g0 + g1` in either order: the same bits. DualPipe: the
                // four copies added in member order, the local run's copies first: rounding.
                if kind == ScheduleKind::OneFOneB {
                    assert_eq!(
                        loss.to_bits(),
                        want.to_bits(),
                        "{kind}, worker {w}, step {step}"
                    );
                }
                assert!(
                    (loss - want).abs() <= 1e-12 * want.abs(),
                    "{kind}, worker {w}, step {step}: {loss} vs {want}"
                );
                // Every held stage's exchange started inside the pipeline, DualPipe's too
                // (each holder of a copy starts its own part of the sum).
                assert_eq!(started, held.len(), "{kind}, worker {w}, step {step}");
            }
        }
    }
}

#[test]
fn one_rank_per_process_on_our_exchange_sums_dualpipes_copies_inside_it_bit_for_bit() {
    for compression in [Compression::Int8, Compression::OneBit] {
        let config = TrainConfig {
            schedule: ScheduleSection {
                ranks: 4,
                micro_batches: 8,
                ..(tiny(ModelKind::Mlp, ScheduleKind::DualPipe, 8)).schedule
            },
            parallelism: ParallelismSection {
                data_parallel: 2,
                gradient_compression: compression,
                ..(tiny(ModelKind::Mlp, ScheduleKind::DualPipe, 8)).parallelism
            },
            steps: 3,
            ..tiny(ModelKind::Mlp, ScheduleKind::DualPipe, 8)
        };
        let mut local = LocalReplicas::new(config.clone()).unwrap();
        let expected: Vec<f64> = (0..config.steps)
            .map(|_| local.step().unwrap().loss)
            .collect();
        for (w, steps) in one_rank_per_thread(&config, Groups::Ours)
            .into_iter()
            .enumerate()
        {
            for (step, ((loss, started), want)) in steps.into_iter().zip(&expected).enumerate() {
                // The copies summed by their lead in direction order, as one process does.
                assert_eq!(
                    loss.to_bits(),
                    want.to_bits(),
                    "{compression:?}, worker {w}, step {step}: {loss} vs {want}"
                );
                // Both of the worker's stages (one led, one sent to its lead) from the hook.
                assert_eq!(started, 2, "{compression:?}, worker {w}, step {step}");
            }
        }
    }
}
