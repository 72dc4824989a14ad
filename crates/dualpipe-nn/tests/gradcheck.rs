//! Gradient checks of the split-backward layers: against central finite differences (f64) and
//! against candle's own autograd (`Var` + `backward()`) as an independent oracle.

use candle_core::{DType, Tensor, Var};
use dualpipe_nn::layers::{mse_grad, mse_loss, Gelu, Linear, MlpBlock};
use dualpipe_nn::rng::{stream, Purpose};
use dualpipe_schedule::Chunk;
use dualpipe_testutil::{assert_close, from_values, rand_tensor, rel_err, scalar_rel, values};

const KEY: Chunk = Chunk::new(0, 0, 0);
const EPS: f64 = 1e-6;
/// Central differences in f64 with eps 1e-6 are good to ~1e-8 on these smooth functions.
const FD_TOL: f64 = 1e-7;
/// Autograd and the hand-written backward do the same arithmetic up to rounding.
const AD_TOL: f64 = 1e-12;

/// GELU built from elementary ops so candle's autograd differentiates it exactly
/// (candle's own `gelu_erf` backward uses a rounded 1/√(2π)).
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

fn linear_oracle(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Tensor {
    let y = x.matmul(&w.t().unwrap()).unwrap();
    match b {
        Some(b) => y.broadcast_add(b).unwrap(),
        None => y,
    }
}

/// Central finite difference of `f` with respect to every element of `at`.
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

/// `L = Σ y ⊙ r`, so `dL/dy = r`.
fn project(y: &Tensor, r: &Tensor) -> f64 {
    (y * r)
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

fn check_linear(bias: bool) {
    let mut rng = stream(11, Purpose::StageParams, 0, 0);
    let mut lin = Linear::random(&mut rng, 5, 3, bias, 1.0, DType::F64).unwrap();
    let x = rand_tensor(1, &[4, 5]);
    let r = rand_tensor(2, &[4, 3]);
    let w = lin.params()[0].value.clone();
    let b = bias.then(|| lin.params()[1].value.clone());

    let y = lin.forward(KEY, &x).unwrap();
    assert_close(
        &y,
        &linear_oracle(&x, &w, b.as_ref()),
        1e-15,
        "Linear forward",
    );
    let dx = lin.backward_input(KEY, &r).unwrap();
    // The weight-gradient GEMMs have not run yet.
    for p in lin.params() {
        assert!(
            values(&p.grad).iter().all(|g| *g == 0.0),
            "I must not touch weight gradients"
        );
    }
    lin.backward_weight(KEY).unwrap();
    assert_eq!(lin.pending(), 0);
    let dw = lin.params()[0].grad.clone();

    // candle autograd.
    let (xv, wv) = (Var::from_tensor(&x).unwrap(), Var::from_tensor(&w).unwrap());
    let bv = b.as_ref().map(|b| Var::from_tensor(b).unwrap());
    let y = linear_oracle(
        xv.as_tensor(),
        wv.as_tensor(),
        bv.as_ref().map(Var::as_tensor),
    );
    let grads = (&y * &r).unwrap().sum_all().unwrap().backward().unwrap();
    assert_close(
        &dx,
        grads.get(&xv).unwrap(),
        AD_TOL,
        "Linear dx vs autograd",
    );
    assert_close(
        &dw,
        grads.get(&wv).unwrap(),
        AD_TOL,
        "Linear dW vs autograd",
    );
    if let Some(bv) = &bv {
        let db = lin.params()[1].grad.clone();
        assert_close(&db, grads.get(bv).unwrap(), AD_TOL, "Linear db vs autograd");
    }

    // Finite differences.
    let fd_x = finite_diff(&x, |x| project(&linear_oracle(x, &w, b.as_ref()), &r));
    assert!(
        rel_err(&values(&dx), &fd_x) < FD_TOL,
        "Linear dx vs finite differences"
    );
    let fd_w = finite_diff(&w, |w| project(&linear_oracle(&x, w, b.as_ref()), &r));
    assert!(
        rel_err(&values(&dw), &fd_w) < FD_TOL,
        "Linear dW vs finite differences"
    );
    if let Some(b) = &b {
        let fd_b = finite_diff(b, |b| project(&linear_oracle(&x, &w, Some(b)), &r));
        let db = values(&lin.params()[1].grad);
        assert!(
            rel_err(&db, &fd_b) < FD_TOL,
            "Linear db vs finite differences"
        );
    }
}

#[test]
fn linear_with_bias_gradients() {
    check_linear(true);
}

#[test]
fn linear_without_bias_gradients() {
    check_linear(false);
}

#[test]
fn gelu_is_the_erf_form_and_its_gradient_is_exact() {
    let x = rand_tensor(3, &[3, 7]).affine(3.0, 0.0).unwrap();
    let r = rand_tensor(4, &[3, 7]);
    let mut gelu = Gelu::new();
    let y = gelu.forward(KEY, &x).unwrap();
    assert_close(&y, &gelu_oracle(&x), 1e-15, "GELU forward vs x Φ(x)");
    // Far from the tanh approximation's values at |x| ≈ 2..3 it matches erf to ~1e-16, while
    // the tanh form differs by ~1e-4: make sure we picked erf.
    let tanh_form = x.gelu().unwrap();
    assert!(rel_err(&values(&y), &values(&tanh_form)) > 1e-6);
    let dx = gelu.backward_input(KEY, &r).unwrap();
    assert_eq!(
        gelu.pending(),
        0,
        "GELU keeps nothing after its input backward"
    );

    let xv = Var::from_tensor(&x).unwrap();
    let grads = (gelu_oracle(xv.as_tensor()) * &r)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_close(&dx, grads.get(&xv).unwrap(), AD_TOL, "GELU dx vs autograd");
    // candle's fused gelu_erf backward rounds 1/√(2π) to 6 digits: agree loosely.
    let xv2 = Var::from_tensor(&x).unwrap();
    let grads2 = (xv2.as_tensor().gelu_erf().unwrap() * &r)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_close(
        &dx,
        grads2.get(&xv2).unwrap(),
        1e-5,
        "GELU dx vs candle gelu_erf autograd",
    );
    let fd = finite_diff(&x, |x| project(&gelu_oracle(x), &r));
    assert!(
        rel_err(&values(&dx), &fd) < FD_TOL,
        "GELU dx vs finite differences"
    );
}

#[test]
fn mse_loss_and_gradient() {
    let y = rand_tensor(5, &[3, 4]);
    let t = rand_tensor(6, &[3, 4]);
    let loss = mse_loss(&y, &t).unwrap();
    let manual = values(&y)
        .iter()
        .zip(values(&t))
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f64>()
        / 12.0;
    assert!(scalar_rel(loss, manual) < 1e-15);
    let scale = 0.25;
    let g = mse_grad(&y, &t, scale).unwrap();
    let yv = Var::from_tensor(&y).unwrap();
    let grads = (yv.as_tensor() - &t)
        .unwrap()
        .sqr()
        .unwrap()
        .mean_all()
        .unwrap()
        .affine(scale, 0.0)
        .unwrap()
        .backward()
        .unwrap();
    assert_close(
        &g,
        grads.get(&yv).unwrap(),
        AD_TOL,
        "MSE gradient vs autograd",
    );
    let fd = finite_diff(&y, |y| scale * mse_loss(y, &t).unwrap());
    assert!(
        rel_err(&values(&g), &fd) < FD_TOL,
        "MSE gradient vs finite differences"
    );
}

fn block_oracle(x: &Tensor, p: &[Tensor]) -> Tensor {
    let h = gelu_oracle(&linear_oracle(x, &p[0], Some(&p[1])));
    (x + linear_oracle(&h, &p[2], Some(&p[3]))).unwrap()
}

#[test]
fn mlp_block_gradients() {
    let mut rng = stream(12, Purpose::StageParams, 0, 0);
    let mut block = MlpBlock::random(&mut rng, 3, 1.5, DType::F64).unwrap();
    let x = rand_tensor(7, &[2, 3]);
    let r = rand_tensor(8, &[2, 3]);
    let p: Vec<Tensor> = block.params().iter().map(|p| p.value.clone()).collect();
    let y = block.forward(KEY, &x).unwrap();
    assert_close(&y, &block_oracle(&x, &p), 1e-14, "block forward");
    let dx = block.backward_input(KEY, &r).unwrap();
    block.backward_weight(KEY).unwrap();
    assert_eq!(block.pending(), 0);
    let ours: Vec<Tensor> = block.params().iter().map(|p| p.grad.clone()).collect();

    let xv = Var::from_tensor(&x).unwrap();
    let pv: Vec<Var> = p.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
    let pt: Vec<Tensor> = pv.iter().map(|v| v.as_tensor().clone()).collect();
    let grads = (block_oracle(xv.as_tensor(), &pt) * &r)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_close(&dx, grads.get(&xv).unwrap(), AD_TOL, "block dx vs autograd");
    for (i, (g, v)) in ours.iter().zip(&pv).enumerate() {
        assert_close(
            g,
            grads.get(v).unwrap(),
            AD_TOL,
            &format!("block param {i} vs autograd"),
        );
        let fd = finite_diff(&p[i], |pi| {
            let mut q = p.clone();
            q[i] = pi.clone();
            project(&block_oracle(&x, &q), &r)
        });
        assert!(
            rel_err(&values(g), &fd) < FD_TOL,
            "block param {i} vs finite differences"
        );
    }
    let fd_x = finite_diff(&x, |x| project(&block_oracle(x, &p), &r));
    assert!(
        rel_err(&values(&dx), &fd_x) < FD_TOL,
        "block dx vs finite differences"
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// For any shape, the split backward of a linear layer equals candle's autograd.
        #[test]
        fn linear_split_backward_matches_autograd(
            rows in 1usize..6,
            input in 1usize..7,
            output in 1usize..7,
            bias in any::<bool>(),
            seed in 0u64..1000,
        ) {
            let mut rng = stream(seed, Purpose::StageParams, 1, 0);
            let mut lin = Linear::random(&mut rng, input, output, bias, 1.0, DType::F64).unwrap();
            let x = rand_tensor(seed, &[rows, input]);
            let r = rand_tensor(seed + 1, &[rows, output]);
            let w = lin.params()[0].value.clone();
            let b = bias.then(|| lin.params()[1].value.clone());
            lin.forward(KEY, &x).unwrap();
            let dx = lin.backward_input(KEY, &r).unwrap();
            lin.backward_weight(KEY).unwrap();
            let xv = Var::from_tensor(&x).unwrap();
            let wv = Var::from_tensor(&w).unwrap();
            let bv = b.as_ref().map(|b| Var::from_tensor(b).unwrap());
            let y = linear_oracle(xv.as_tensor(), wv.as_tensor(), bv.as_ref().map(Var::as_tensor));
            let grads = (&y * &r).unwrap().sum_all().unwrap().backward().unwrap();
            prop_assert!(rel_err(&values(&dx), &values(grads.get(&xv).unwrap())) <= AD_TOL);
            prop_assert!(rel_err(&values(&lin.params()[0].grad), &values(grads.get(&wv).unwrap())) <= AD_TOL);
            if let Some(bv) = &bv {
                prop_assert!(rel_err(&values(&lin.params()[1].grad), &values(grads.get(bv).unwrap())) <= AD_TOL);
            }
        }
    }
}
