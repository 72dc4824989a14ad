//! Gradient checks of the GPT's layers and of the whole model (f64): against candle's autograd
//! on an independent formulation of the documented architecture, and against central finite
//! differences; the weight gradients appear only after W.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var, D};
use dualpipe_nn::gpt::pipeline::sequential_step;
use dualpipe_nn::gpt::{tensor_names, GptConfig, GptStage, GptWeights, TokenMicroBatch};
use dualpipe_nn::layers::{cross_entropy, CausalSelfAttention, Linear, RmsNorm};
use dualpipe_nn::StagePosition;
use dualpipe_runtime::{ForwardInput, Stage};
use dualpipe_schedule::Chunk;
use dualpipe_testutil::{assert_close, from_values, rand_tensor, rel_err, scalar_rel, values};

const KEY: Chunk = Chunk::new(0, 0, 0);
const EPS: f64 = 1e-6;
const FD_TOL: f64 = 1e-7;
const AD_TOL: f64 = 1e-10;

fn config() -> GptConfig {
    GptConfig {
        d_model: 8,
        heads: 2,
        layers: 2,
        seq_len: 5,
        dtype: DType::F64,
        moe: None,
    }
}

fn tokens(seed: u64, n: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((i * 7919 + seed * 104_729) % 251) as u32)
        .collect()
}

fn micro_batch(seed: u64, rows: usize, seq: usize) -> TokenMicroBatch {
    let ids = tokens(seed, rows * (seq + 1));
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

// ---- the oracle: the documented architecture in candle ops, differentiated by candle ----

fn rms_norm_oracle(x: &Tensor, w: &Tensor) -> Tensor {
    let ms = x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
    let inv = (ms + 1e-5).unwrap().sqrt().unwrap().recip().unwrap();
    x.broadcast_mul(&inv).unwrap().broadcast_mul(w).unwrap()
}

fn gelu_oracle(x: &Tensor) -> Tensor {
    let cdf = x
        .affine(std::f64::consts::FRAC_1_SQRT_2, 0.0)
        .unwrap()
        .erf()
        .unwrap()
        .affine(0.5, 0.5)
        .unwrap();
    (x * cdf).unwrap()
}

fn softmax_last(s: &Tensor) -> Tensor {
    let max = s.max_keepdim(D::Minus1).unwrap().detach();
    let e = s.broadcast_sub(&max).unwrap().exp().unwrap();
    let sum = e.sum_keepdim(D::Minus1).unwrap();
    e.broadcast_div(&sum).unwrap()
}

/// `x: [rows·seq, d]` → attention output before the projection's residual.
fn attention_oracle(
    x: &Tensor,
    wqkv: &Tensor,
    wproj: &Tensor,
    rows: usize,
    seq: usize,
    heads: usize,
) -> Tensor {
    let d = x.dims()[1];
    let hd = d / heads;
    let qkv = x.matmul(&wqkv.t().unwrap()).unwrap();
    let qkv = qkv.reshape((rows, seq, 3, heads, hd)).unwrap();
    let part = |i: usize| {
        qkv.narrow(2, i, 1)
            .unwrap()
            .squeeze(2)
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
    };
    let (q, k, v) = (part(0), part(1), part(2));
    let s = q
        .matmul(&k.transpose(2, 3).unwrap().contiguous().unwrap())
        .unwrap()
        .affine(1.0 / (hd as f64).sqrt(), 0.0)
        .unwrap();
    let mask: Vec<f64> = (0..seq * seq)
        .map(|i| if i % seq > i / seq { -1e30 } else { 0.0 })
        .collect();
    let mask = Tensor::from_vec(mask, (seq, seq), &Device::Cpu).unwrap();
    let p = softmax_last(&s.broadcast_add(&mask).unwrap());
    let o = p
        .matmul(&v)
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape((rows * seq, d))
        .unwrap();
    o.matmul(&wproj.t().unwrap()).unwrap()
}

fn model_oracle(p: &HashMap<String, Var>, c: &GptConfig, mb: &TokenMicroBatch) -> Tensor {
    let w = |n: &str| p[n].as_tensor().clone();
    let (rows, seq) = (mb.rows, mb.seq);
    let ids = Tensor::from_vec(mb.inputs.to_vec(), rows * seq, &Device::Cpu).unwrap();
    let tok = w("tok_emb.weight").index_select(&ids, 0).unwrap();
    let pos = w("pos_emb.weight").narrow(0, 0, seq).unwrap();
    let mut h = tok
        .reshape((rows, seq, c.d_model))
        .unwrap()
        .broadcast_add(&pos)
        .unwrap()
        .reshape((rows * seq, c.d_model))
        .unwrap();
    for l in 0..c.layers {
        let b = |s: &str| w(&format!("blocks.{l}.{s}.weight"));
        let a = rms_norm_oracle(&h, &b("norm1"));
        h = (&h + attention_oracle(&a, &b("attn.qkv"), &b("attn.proj"), rows, seq, c.heads))
            .unwrap();
        let m = rms_norm_oracle(&h, &b("norm2"));
        let f = gelu_oracle(&m.matmul(&b("mlp.fc1").t().unwrap()).unwrap());
        h = (&h + f.matmul(&b("mlp.fc2").t().unwrap()).unwrap()).unwrap();
    }
    let logits = rms_norm_oracle(&h, &w("norm_f.weight"))
        .matmul(&w("lm_head.weight").t().unwrap())
        .unwrap();
    let lse = {
        let max = logits.max_keepdim(D::Minus1).unwrap().detach();
        let e = logits.broadcast_sub(&max).unwrap().exp().unwrap();
        (e.sum_keepdim(D::Minus1).unwrap().log().unwrap() + max).unwrap()
    };
    let t = Tensor::from_vec(mb.targets.to_vec(), (rows * seq, 1), &Device::Cpu).unwrap();
    let picked = logits.gather(&t, 1).unwrap();
    (lse - picked).unwrap().mean_all().unwrap()
}

fn whole(weights: &GptWeights, micro_batches: usize) -> GptStage {
    GptStage::new(
        weights,
        1,
        StagePosition {
            dir: 0,
            model_stage: 0,
            micro_batches,
            micro_batches_per_dir: micro_batches,
        },
    )
    .unwrap()
}

fn model_loss(weights: &GptWeights, mb: &TokenMicroBatch) -> f64 {
    let stage = whole(weights, 1);
    let logits = stage.logits(&mb.inputs, mb.seq).unwrap();
    cross_entropy(&logits, &mb.targets, 1.0).unwrap().0
}

#[test]
fn whole_model_matches_autograd_and_finite_differences() {
    let c = config();
    let weights = GptWeights::random(&c, 9).unwrap();
    let mb = micro_batch(3, 2, 5);
    let mut stage = whole(&weights, 1);
    stage.set_batch(Arc::new(vec![mb.clone()]));
    let out = stage
        .forward(KEY, ForwardInput::MicroBatch { global_mb: 0 })
        .unwrap();
    let dualpipe_runtime::ForwardOutput::Loss(loss) = out else {
        panic!("the whole model returns its loss")
    };
    assert!(stage.backward_input(KEY, None).unwrap().is_none());
    assert!(
        stage
            .gradients()
            .iter()
            .all(|g| values(g).iter().all(|v| *v == 0.0)),
        "no weight gradient before W"
    );
    stage.backward_weight(KEY).unwrap();
    assert_eq!(stage.pending(), 0);
    let grads: HashMap<String, Tensor> = stage
        .param_names()
        .into_iter()
        .zip(stage.gradients())
        .collect();
    assert_eq!(grads.len(), tensor_names(&c).len());

    let vars: HashMap<String, Var> = tensor_names(&c)
        .into_iter()
        .map(|(n, _)| {
            let v = Var::from_tensor(weights.get(&n).unwrap()).unwrap();
            (n, v)
        })
        .collect();
    let oracle = model_oracle(&vars, &c, &mb);
    let oracle_loss = oracle.to_scalar::<f64>().unwrap();
    assert!(
        scalar_rel(loss, oracle_loss) < AD_TOL,
        "loss {loss} vs autograd {oracle_loss}"
    );
    let store = oracle.backward().unwrap();
    for (name, var) in &vars {
        let want = store.get(var.as_tensor()).unwrap();
        assert_close(
            &grads[name],
            want,
            AD_TOL,
            &format!("autograd gradient of {name}"),
        );
    }

    // Finite differences on a few entries of every tensor.
    for (name, _) in tensor_names(&c) {
        let base = values(weights.get(&name).unwrap());
        let g = values(&grads[&name]);
        for i in [0, base.len() / 2, base.len() - 1] {
            let at = |delta: f64| {
                let mut v = base.clone();
                v[i] += delta;
                let mut w = weights.clone();
                w.set(&name, from_values(v, weights.get(&name).unwrap()))
                    .unwrap();
                model_loss(&w, &mb)
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
fn rms_norm_gradients() {
    let x = rand_tensor(1, &[3, 6]);
    let w = (rand_tensor(2, &[6]) + 1.5).unwrap();
    let r = rand_tensor(3, &[3, 6]);
    let mut norm = RmsNorm::from_tensor(w.clone()).unwrap();
    let y = norm.forward(KEY, &x).unwrap();
    assert_close(&y, &rms_norm_oracle(&x, &w), 1e-14, "RMSNorm forward");
    let dx = norm.backward_input(KEY, &r, None).unwrap();
    assert!(values(&norm.params()[0].grad).iter().all(|v| *v == 0.0));
    norm.backward_weight(KEY).unwrap();
    let project = |y: &Tensor| {
        (y * &r)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    let fd_x = finite_diff(&x, |x| project(&rms_norm_oracle(x, &w)));
    assert!(rel_err(&values(&dx), &fd_x) < FD_TOL);
    let fd_w = finite_diff(&w, |w| project(&rms_norm_oracle(&x, w)));
    assert!(rel_err(&values(&norm.params()[0].grad), &fd_w) < FD_TOL);
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

#[test]
fn attention_gradients_against_finite_differences_and_autograd() {
    let (rows, seq, d, heads) = (2, 4, 6, 3);
    let x = rand_tensor(4, &[rows * seq, d]);
    let wqkv = rand_tensor(5, &[3 * d, d]);
    let wproj = rand_tensor(6, &[d, d]);
    let r = rand_tensor(7, &[rows * seq, d]);
    let mut attn = CausalSelfAttention::from_layers(
        Linear::from_tensors(wqkv.clone(), None).unwrap(),
        Linear::from_tensors(wproj.clone(), None).unwrap(),
        heads,
    )
    .unwrap();
    let y = attn.forward(KEY, &x, seq, None).unwrap();
    assert_close(
        &y,
        &attention_oracle(&x, &wqkv, &wproj, rows, seq, heads),
        1e-13,
        "attention forward",
    );
    let dx = attn.backward_input(KEY, &r).unwrap();
    assert!(attn
        .params()
        .iter()
        .all(|p| values(&p.grad).iter().all(|v| *v == 0.0)));
    attn.backward_weight(KEY).unwrap();
    assert_eq!(attn.pending(), 0);
    let project = |y: &Tensor| {
        (y * &r)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    let fd = finite_diff(&x, |x| {
        project(&attention_oracle(x, &wqkv, &wproj, rows, seq, heads))
    });
    assert!(rel_err(&values(&dx), &fd) < FD_TOL, "attention dx");
    let fd = finite_diff(&wqkv, |w| {
        project(&attention_oracle(&x, w, &wproj, rows, seq, heads))
    });
    assert!(
        rel_err(&values(&attn.params()[0].grad), &fd) < FD_TOL,
        "attention dWqkv"
    );
    // Causality: the first position's output does not depend on later inputs.
    let mut later = values(&x);
    for v in &mut later[d..seq * d] {
        *v += 1.0;
    }
    let y2 = attn.apply(&from_values(later, &x), seq, None).unwrap();
    assert!(rel_err(&values(&y2)[..d], &values(&y)[..d]) < 1e-15);
}

#[test]
fn cross_entropy_matches_its_definition() {
    let logits = rand_tensor(8, &[3, 256]);
    let targets = [5u32, 0, 255];
    let (loss, grad) = cross_entropy(&logits, &targets, 0.5).unwrap();
    let v = values(&logits);
    let mut want = 0.0;
    for (r, &t) in targets.iter().enumerate() {
        let row = &v[r * 256..(r + 1) * 256];
        let lse = row.iter().map(|x| x.exp()).sum::<f64>().ln();
        want += lse - row[t as usize];
    }
    want /= 3.0;
    assert!(scalar_rel(loss, want) < 1e-14);
    let fd = finite_diff(&logits, |l| {
        0.5 * cross_entropy(l, &targets, 1.0).unwrap().0
    });
    assert!(rel_err(&values(&grad), &fd) < FD_TOL);
    assert!(cross_entropy(&logits, &[256, 0, 0], 1.0).is_err());
}

#[test]
fn f32_model_agrees_with_f64() {
    let c = config();
    let w64 = GptWeights::random(&c, 4).unwrap();
    let w32 = GptWeights::random(
        &GptConfig {
            dtype: DType::F32,
            ..c
        },
        4,
    )
    .unwrap();
    let mb = Arc::new(vec![micro_batch(1, 2, 5), micro_batch(2, 2, 5)]);
    let mut s64 = whole(&w64, 2);
    let mut s32 = whole(&w32, 2);
    let l64 = sequential_step(&mut s64, mb.clone()).unwrap();
    let l32 = sequential_step(&mut s32, mb).unwrap();
    for (a, b) in l32.iter().zip(&l64) {
        assert!(scalar_rel(*a, *b) < 1e-5, "f32 loss {a} vs f64 {b}");
    }
    for (g32, g64) in s32.gradients().iter().zip(s64.gradients()) {
        assert!(rel_err(&values(g32), &values(&g64)) < 1e-4);
    }
}
