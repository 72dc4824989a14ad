//! The MoE feed-forward in f64: the layer against an independent formulation (host softmax,
//! its own top-k, every expert on every row) and central finite differences for the input,
//! the router, routed and shared experts, with and without the auxiliary loss; the whole MoE
//! model's gradients against finite differences; the split backward (no weight gradient
//! before W); the safetensors round trip with the MoE names; the bias step.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use dualpipe_nn::gpt::moe::router::{route, top_k};
use dualpipe_nn::gpt::{
    tensor_names, GptConfig, GptStage, GptWeights, MoeConfig, MoeLayer, TokenMicroBatch,
};
use dualpipe_nn::layers::{cross_entropy, Linear, Mlp};
use dualpipe_nn::StagePosition;
use dualpipe_runtime::{ForwardInput, ForwardOutput, Stage};
use dualpipe_schedule::Chunk;
use dualpipe_testutil::{from_values, rand_tensor, rel_err, scalar_rel, values};

const KEY: Chunk = Chunk::new(0, 0, 0);
const EPS: f64 = 1e-6;
const FD_TOL: f64 = 1e-7;

struct Weights {
    router: Tensor,
    bias: Vec<f64>,
    experts: Vec<(Tensor, Tensor)>,
    shared: Vec<(Tensor, Tensor)>,
}

const D_MODEL: usize = 6;
const HIDDEN: usize = 5;
const EXPERTS: usize = 4;
const K: usize = 2;

fn layer_weights(seed: u64) -> Weights {
    let pair = |s: u64| {
        (
            rand_tensor(s, &[HIDDEN, D_MODEL]),
            rand_tensor(s + 1, &[D_MODEL, HIDDEN]),
        )
    };
    Weights {
        router: rand_tensor(seed, &[EXPERTS, D_MODEL]),
        bias: vec![0.0, 0.05, -0.03, 0.02],
        experts: (0..EXPERTS as u64)
            .map(|e| pair(seed + 10 + 2 * e))
            .collect(),
        shared: vec![pair(seed + 40)],
    }
}

fn build(w: &Weights) -> MoeLayer {
    let mlp = |(a, b): &(Tensor, Tensor)| {
        Mlp::from_layers(
            Linear::from_tensors(a.clone(), None).unwrap(),
            Linear::from_tensors(b.clone(), None).unwrap(),
        )
        .unwrap()
    };
    MoeLayer::new(
        Linear::from_tensors(w.router.clone(), None).unwrap(),
        w.bias.clone(),
        w.experts.iter().map(mlp).collect(),
        w.shared.iter().map(mlp).collect(),
        K,
    )
    .unwrap()
}

fn gelu(x: &Tensor) -> Tensor {
    let cdf = x
        .affine(std::f64::consts::FRAC_1_SQRT_2, 0.0)
        .unwrap()
        .erf()
        .unwrap()
        .affine(0.5, 0.5)
        .unwrap();
    (x * cdf).unwrap()
}

fn mlp_oracle(x: &Tensor, (a, b): &(Tensor, Tensor)) -> Tensor {
    gelu(&x.matmul(&a.t().unwrap()).unwrap())
        .matmul(&b.t().unwrap())
        .unwrap()
}

/// The documented layer written independently: every expert on every row, host softmax and
/// a selection loop of its own. Returns the output and the auxiliary loss term.
fn layer_oracle(x: &Tensor, w: &Weights, aux_coef: f64) -> (Tensor, f64) {
    let n = x.dims()[0];
    let logits = values(&x.matmul(&w.router.t().unwrap()).unwrap());
    let mut probs = vec![0.0; n * EXPERTS];
    let mut gates = vec![0.0; n * EXPERTS];
    let mut counts = [0usize; EXPERTS];
    for t in 0..n {
        let row = &logits[t * EXPERTS..(t + 1) * EXPERTS];
        let z: f64 = row.iter().map(|v| v.exp()).sum();
        let p: Vec<f64> = row.iter().map(|v| v.exp() / z).collect();
        let mut picked: Vec<usize> = Vec::new();
        for _ in 0..K {
            let mut best: Option<usize> = None;
            for j in 0..EXPERTS {
                if picked.contains(&j) {
                    continue;
                }
                let s = p[j] + w.bias[j];
                if best.is_none_or(|b| s > p[b] + w.bias[b]) {
                    best = Some(j);
                }
            }
            picked.push(best.unwrap());
        }
        let total: f64 = picked.iter().map(|&j| p[j]).sum();
        for &j in &picked {
            gates[t * EXPERTS + j] = p[j] / total;
            counts[j] += 1;
        }
        probs[t * EXPERTS..(t + 1) * EXPERTS].copy_from_slice(&p);
    }
    let mut y = x.zeros_like().unwrap();
    for (j, e) in w.experts.iter().enumerate() {
        let g: Vec<f64> = (0..n).map(|t| gates[t * EXPERTS + j]).collect();
        let g = Tensor::from_vec(g, (n, 1), &Device::Cpu).unwrap();
        y = (y + mlp_oracle(x, e).broadcast_mul(&g).unwrap()).unwrap();
    }
    for s in &w.shared {
        y = (y + mlp_oracle(x, s)).unwrap();
    }
    let aux: f64 = (0..EXPERTS)
        .map(|j| {
            let f = counts[j] as f64 / (n * K) as f64;
            let mean_p = (0..n).map(|t| probs[t * EXPERTS + j]).sum::<f64>() / n as f64;
            f * mean_p
        })
        .sum::<f64>()
        * aux_coef
        * EXPERTS as f64;
    (y, aux)
}

fn finite_diff(at: &Tensor, f: impl Fn(&Tensor) -> f64) -> Vec<f64> {
    let base = values(at);
    (0..base.len())
        .map(|i| {
            let mut plus = base.clone();
            plus[i] += EPS;
            let mut minus = base.clone();
            minus[i] -= EPS;
            (f(&from_values(plus, at)) - f(&from_values(minus, at))) / (2.0 * EPS)
        })
        .collect()
}

fn check_layer(aux_coef: f64) {
    let n = 9;
    let x = rand_tensor(1, &[n, D_MODEL]);
    let r = rand_tensor(2, &[n, D_MODEL]);
    let w = layer_weights(3);
    let mut moe = build(&w);
    moe.set_aux_loss(aux_coef, 1.0);
    let y = moe.forward(KEY, &x, None).unwrap();
    let (want, _) = layer_oracle(&x, &w, aux_coef);
    assert!(rel_err(&values(&y), &values(&want)) < 1e-13, "MoE forward");
    assert!(rel_err(&values(&moe.apply(&x, None).unwrap()), &values(&y)) == 0.0);
    assert_eq!(
        moe.token_counts().iter().sum::<u64>(),
        (n * K) as u64,
        "dropless: every token reaches k experts"
    );
    let dx = moe.backward_input(KEY, &r).unwrap();
    assert!(
        moe.params()
            .iter()
            .all(|p| values(&p.grad).iter().all(|v| *v == 0.0)),
        "no weight gradient before W"
    );
    moe.backward_weight(KEY).unwrap();
    assert_eq!(moe.pending(), 0);

    let objective = |x: &Tensor, w: &Weights| {
        let (y, aux) = layer_oracle(x, w, aux_coef);
        (y * &r)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
            + aux
    };
    let fd = finite_diff(&x, |x| objective(x, &w));
    assert!(rel_err(&values(&dx), &fd) < FD_TOL, "MoE dx");
    let params = moe.params();
    // Router, every routed expert's two weights, the shared expert's two.
    let with = |i: usize, t: &Tensor| {
        let mut w2 = Weights {
            router: w.router.clone(),
            bias: w.bias.clone(),
            experts: w.experts.clone(),
            shared: w.shared.clone(),
        };
        match i {
            0 => w2.router = t.clone(),
            i if i <= 2 * EXPERTS => {
                let (e, second) = ((i - 1) / 2, (i - 1) % 2 == 1);
                if second {
                    w2.experts[e].1 = t.clone()
                } else {
                    w2.experts[e].0 = t.clone()
                }
            }
            i => {
                if (i - 1) % 2 == 1 {
                    w2.shared[0].1 = t.clone()
                } else {
                    w2.shared[0].0 = t.clone()
                }
            }
        }
        w2
    };
    for (i, p) in params.iter().enumerate() {
        let fd = finite_diff(&p.value, |t| objective(&x, &with(i, t)));
        let g = values(&p.grad);
        let scale = fd.iter().map(|v| v.abs()).fold(0.0, f64::max);
        if scale == 0.0 {
            assert!(g.iter().all(|v| *v == 0.0), "param {i}: an idle expert");
        } else {
            assert!(rel_err(&g, &fd) < FD_TOL, "param {i}: gradient vs FD");
        }
    }
    assert_eq!(params.len(), 1 + 2 * EXPERTS + 2);
}

#[test]
fn moe_layer_matches_its_definition_and_finite_differences() {
    check_layer(0.0);
}

#[test]
fn the_auxiliary_loss_adds_its_gradient() {
    check_layer(0.3);
    // And it changes the router's gradient.
    let x = rand_tensor(1, &[9, D_MODEL]);
    let r = rand_tensor(2, &[9, D_MODEL]);
    let w = layer_weights(3);
    let grads = |coef: f64| {
        let mut moe = build(&w);
        moe.set_aux_loss(coef, 1.0);
        moe.forward(KEY, &x, None).unwrap();
        moe.backward_input(KEY, &r).unwrap();
        moe.backward_weight(KEY).unwrap();
        values(&moe.params()[0].grad)
    };
    assert!(rel_err(&grads(0.3), &grads(0.0)) > 1e-6);
}

#[test]
fn routing_is_deterministic_and_the_bias_balances() {
    assert_eq!(top_k(&[0.2, 0.4, 0.4, 0.0], 2), vec![1, 2]);
    // Every token leans to expert 0; the bias steps move load off it.
    let noise = values(&rand_tensor(9, &[200, EXPERTS]));
    let logits: Vec<f64> = noise
        .chunks(EXPERTS)
        .flat_map(|u| [1.5 + u[0], u[1], u[2], u[3]])
        .collect();
    let w = layer_weights(3);
    let mut moe = build(&w);
    let worst = |bias: &[f64]| {
        *route(&logits, EXPERTS, K, bias)
            .counts()
            .iter()
            .max()
            .unwrap()
    };
    let before = worst(moe.selection_bias());
    let mut late = 0;
    for i in 0..200 {
        let counts = route(&logits, EXPERTS, K, moe.selection_bias()).counts();
        moe.update_selection_bias(&counts, 0.005).unwrap();
        if i >= 150 {
            late += worst(moe.selection_bias());
        }
    }
    let late = late as f64 / 50.0;
    // Balanced would be 100 of 200 tokens' 400 assignments per expert.
    assert!(
        before > 150 && late < 0.8 * before as f64,
        "max tokens per expert {before} before, {late} late"
    );
    assert!(moe.update_selection_bias(&[1, 2], 0.1).is_err());
}

fn moe_config() -> GptConfig {
    GptConfig {
        d_model: 8,
        heads: 2,
        layers: 2,
        seq_len: 5,
        dtype: DType::F64,
        moe: Some(MoeConfig {
            experts: 4,
            top_k: 2,
            expert_hidden: 6,
            shared_experts: 1,
            every: 2,
        }),
    }
}

fn micro_batch(seed: u64, rows: usize, seq: usize) -> TokenMicroBatch {
    let ids: Vec<u32> = (0..(rows * (seq + 1)) as u64)
        .map(|i| ((i * 7919 + seed * 104_729) % 251) as u32)
        .collect();
    let mut inputs = Vec::new();
    let mut targets = Vec::new();
    for r in 0..rows {
        let w = &ids[r * (seq + 1)..(r + 1) * (seq + 1)];
        inputs.extend_from_slice(&w[..seq]);
        targets.extend_from_slice(&w[1..]);
    }
    TokenMicroBatch {
        inputs: inputs.into(),
        targets: targets.into(),
        rows,
        seq,
    }
}

fn whole(weights: &GptWeights) -> GptStage {
    GptStage::new(
        weights,
        1,
        StagePosition {
            dir: 0,
            model_stage: 0,
            micro_batches: 1,
            micro_batches_per_dir: 1,
        },
    )
    .unwrap()
}

fn biased_weights() -> GptWeights {
    let mut w = GptWeights::random(&moe_config(), 5).unwrap();
    let bias = Tensor::new(&[0.01f64, -0.02, 0.0, 0.03], &Device::Cpu).unwrap();
    w.set("blocks.1.moe.router.selection_bias", bias).unwrap();
    w
}

#[test]
fn moe_model_gradients_match_finite_differences() {
    let c = moe_config();
    let weights = biased_weights();
    let mb = micro_batch(3, 2, 5);
    let mut stage = whole(&weights);
    stage.set_batch(Arc::new(vec![mb.clone()]));
    let ForwardOutput::Loss(loss) = stage
        .forward(KEY, ForwardInput::MicroBatch { global_mb: 0 })
        .unwrap()
    else {
        panic!("the whole model returns its loss")
    };
    let counts = stage.router_counts();
    assert_eq!(counts.len(), 1, "only block 1 is an MoE block");
    assert_eq!(counts[0].0, 1);
    assert_eq!(counts[0].1.iter().sum::<u64>(), 2 * 5 * 2);
    stage.backward_input(KEY, None).unwrap();
    assert!(
        stage
            .gradients()
            .iter()
            .all(|g| values(g).iter().all(|v| *v == 0.0)),
        "no weight gradient before W"
    );
    stage.backward_weight(KEY).unwrap();
    assert_eq!(stage.pending(), 0);
    let names = stage.param_names();
    assert_eq!(
        names.len() + stage.buffer_names().len(),
        tensor_names(&c).len()
    );
    let model_loss = |w: &GptWeights| {
        let s = whole(w);
        let logits = s.logits(&mb.inputs, mb.seq).unwrap();
        cross_entropy(&logits, &mb.targets, 1.0).unwrap().0
    };
    assert!(scalar_rel(loss, model_loss(&weights)) < 1e-14);
    for (name, g) in names.iter().zip(stage.gradients()) {
        let base = values(weights.get(name).unwrap());
        let g = values(&g);
        for i in [0, base.len() / 2, base.len() - 1] {
            let at = |delta: f64| {
                let mut v = base.clone();
                v[i] += delta;
                let mut w = weights.clone();
                w.set(name, from_values(v, weights.get(name).unwrap()))
                    .unwrap();
                model_loss(&w)
            };
            let fd = (at(EPS) - at(-EPS)) / (2.0 * EPS);
            assert!(
                (fd - g[i]).abs() <= FD_TOL * (1.0 + fd.abs()),
                "{name}[{i}]: finite difference {fd} vs {}",
                g[i]
            );
        }
    }
}

#[test]
fn moe_weights_round_trip_with_their_names() {
    let c = moe_config();
    let names: Vec<String> = tensor_names(&c).into_iter().map(|(n, _)| n).collect();
    for want in [
        "blocks.0.mlp.fc1.weight",
        "blocks.1.moe.router.weight",
        "blocks.1.moe.router.selection_bias",
        "blocks.1.moe.experts.0.fc1.weight",
        "blocks.1.moe.experts.3.fc2.weight",
        "blocks.1.moe.shared.0.fc1.weight",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing");
    }
    assert!(!names.iter().any(|n| n == "blocks.1.mlp.fc1.weight"));
    let w = biased_weights();
    let bytes = w.to_safetensors().unwrap();
    let back = GptWeights::from_safetensors(&bytes, DType::F64).unwrap();
    assert_eq!(back.config(), &c);
    for n in &names {
        assert_eq!(
            values(back.get(n).unwrap()),
            values(w.get(n).unwrap()),
            "{n}"
        );
    }
    assert_eq!(back.to_safetensors().unwrap(), bytes);
    // The stage writes its bias back beside its parameters.
    let mut stage = whole(&w);
    let layer = stage.moe_layers()[0].0;
    stage
        .update_selection_bias(layer, &[9, 1, 1, 1], 0.5)
        .unwrap();
    let mut out = w.clone();
    stage.write_into(&mut out).unwrap();
    let bias = values(out.get("blocks.1.moe.router.selection_bias").unwrap());
    assert_eq!(bias, vec![0.01 - 0.5, -0.02 + 0.5, 0.5, 0.03 + 0.5]);
    // A dense model's file has no MoE metadata.
    let dense = GptWeights::random(&GptConfig { moe: None, ..c }, 5).unwrap();
    let (_, meta) =
        safetensors::SafeTensors::read_metadata(&dense.to_safetensors().unwrap()).unwrap();
    assert!(!meta.metadata().clone().unwrap().contains_key("experts"));
}

#[test]
fn bad_moe_shapes_are_refused() {
    let c = moe_config();
    let m = c.moe.unwrap();
    for bad in [
        MoeConfig { top_k: 5, ..m },
        MoeConfig { experts: 0, ..m },
        MoeConfig { every: 0, ..m },
        MoeConfig {
            expert_hidden: 0,
            ..m
        },
    ] {
        assert!(GptConfig {
            moe: Some(bad),
            ..c
        }
        .validate()
        .is_err());
    }
    let big = GptConfig {
        moe: Some(MoeConfig {
            experts: 1 << 20,
            expert_hidden: 1 << 20,
            ..m
        }),
        ..c
    };
    assert!(big.validate().is_err(), "the parameter count is bounded");
    // Softmax rows sum to one even for large logits.
    let p = dualpipe_nn::gpt::moe::router::softmax_rows(&[1000.0, 999.0, -5.0], 3);
    assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-15);
}
