//! Property tests of the compressors: sizes, bounds and robustness on arbitrary input.

use dualpipe_dp::{Codec, Compression, Rounding};
use proptest::prelude::*;

fn codec(compression: Compression, chunk_values: usize, rounding: Rounding) -> Codec {
    Codec {
        compression,
        chunk_values,
        rounding,
    }
}

proptest! {
    #[test]
    fn every_value_stays_within_its_compressions_bound(
        values in proptest::collection::vec(-1.0e6f64..1.0e6, 0..300),
        chunk in 1usize..80,
        stochastic in any::<bool>(),
        stream in any::<u64>(),
    ) {
        let rounding = if stochastic { Rounding::Stochastic { seed: 3 } } else { Rounding::Nearest };
        for c in Compression::ALL {
            let codec = codec(c, chunk, rounding);
            let bytes = codec.encode(&values, stream);
            prop_assert_eq!(Some(bytes.len()), codec.encoded_len::<f64>(values.len()));
            let mut out = vec![0.0f64; values.len()];
            codec.decode(&bytes, &mut out).unwrap();
            for (k, (xs, ys)) in values.chunks(chunk).zip(out.chunks(chunk)).enumerate() {
                let max = xs.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                let mean = xs.iter().map(|x| x.abs()).sum::<f64>() / xs.len() as f64;
                for (x, y) in xs.iter().zip(ys) {
                    let err = (x - y).abs();
                    let bound = match c {
                        Compression::None => 0.0,
                        // f64 -> f32 -> bf16: two roundings.
                        Compression::Bf16 => x.abs() * (2f64.powi(-8) + 2f64.powi(-24)) * 1.0001,
                        Compression::Int8 => {
                            // Logarithmic levels 2^(1/8) apart: nearest within 4.33% of the
                            // value, stochastic within one spacing (2^(1/8) - 1 of it); below
                            // the lowest level (2^-15.75 of the max) within that level.
                            let rel = if stochastic { 2f64.powf(0.125) - 1.0 } else { 0.0434 };
                            (x.abs() * rel).max(max * 2f64.powf(-15.75)) * (1.0 + 1e-6)
                                + x.abs() * 1e-7
                                + 1e-300
                        }
                        Compression::OneBit => {
                            // Decoded as +-mean with the sign of x: off by | |x| - mean |.
                            prop_assert!(y.abs() <= mean * (1.0 + 1e-6) + 1e-300);
                            prop_assert!(*x >= 0.0 || *y <= 0.0);
                            (x.abs() - mean).abs() * (1.0 + 1e-6) + mean * 1e-6 + 1e-300
                        }
                    };
                    prop_assert!(err <= bound, "{} chunk {}: {} -> {} (bound {})", c, k, x, y, bound);
                }
            }
        }
    }

    #[test]
    fn arbitrary_bytes_decode_or_fail_cleanly(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        values in 0usize..100,
        chunk in 1usize..40,
    ) {
        for c in Compression::ALL {
            let codec = codec(c, chunk, Rounding::Nearest);
            let mut out = vec![0.0f32; values];
            let ok = codec.decode(&bytes, &mut out).is_ok();
            prop_assert_eq!(ok, codec.encoded_len::<f32>(values) == Some(bytes.len()));
        }
    }
}
