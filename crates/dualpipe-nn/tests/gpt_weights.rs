//! GPT weights as safetensors: the documented names, shapes and metadata, a lossless round
//! trip, and clear errors for files and flags that do not fit.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use dualpipe_nn::gpt::{tensor_names, GptConfig, GptWeights, WeightsError};

fn config() -> GptConfig {
    GptConfig {
        d_model: 8,
        heads: 2,
        layers: 3,
        seq_len: 7,
        dtype: DType::F64,
        moe: None,
    }
}

#[test]
fn names_shapes_and_metadata_are_the_documented_ones() {
    let names = tensor_names(&config());
    assert_eq!(names.len(), 2 + 6 * 3 + 2);
    assert_eq!(names[0], ("tok_emb.weight".to_string(), vec![256, 8]));
    assert_eq!(names[1], ("pos_emb.weight".to_string(), vec![7, 8]));
    assert_eq!(
        names[3],
        ("blocks.0.attn.qkv.weight".to_string(), vec![24, 8])
    );
    assert_eq!(
        names[7],
        ("blocks.0.mlp.fc2.weight".to_string(), vec![8, 32])
    );
    assert_eq!(
        names[19],
        ("blocks.2.mlp.fc2.weight".to_string(), vec![8, 32])
    );
    assert_eq!(names[21], ("lm_head.weight".to_string(), vec![256, 8]));

    let w = GptWeights::random(&config(), 1).unwrap();
    let bytes = w.to_safetensors().unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let md = meta.metadata().clone().unwrap();
    let want: HashMap<String, String> = [
        ("model", "gpt"),
        ("d_model", "8"),
        ("heads", "2"),
        ("layers", "3"),
        ("seq_len", "7"),
        ("vocab", "256"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(md, want);
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut stored: Vec<String> = st.names().into_iter().map(String::from).collect();
    stored.sort();
    let mut expected: Vec<String> = names.into_iter().map(|(n, _)| n).collect();
    expected.sort();
    assert_eq!(stored, expected);
}

#[test]
fn round_trip_is_lossless_and_seeded() {
    let w = GptWeights::random(&config(), 5).unwrap();
    let back = GptWeights::from_safetensors(&w.to_safetensors().unwrap(), DType::F64).unwrap();
    assert_eq!(back.config(), w.config());
    for (name, _) in tensor_names(&config()) {
        let a = w
            .get(&name)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let b = back
            .get(&name)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        assert_eq!(a, b, "{name}");
    }
    let again = GptWeights::random(&config(), 5).unwrap();
    let other = GptWeights::random(&config(), 6).unwrap();
    let v = |w: &GptWeights| {
        w.get("blocks.1.attn.qkv.weight")
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
    };
    assert_eq!(v(&w), v(&again));
    assert_ne!(v(&w), v(&other));
    // The same weights always give the same bytes (the metadata is a hash map inside the
    // writer; every call makes a new one, with a new order).
    let first = w.to_safetensors().unwrap();
    for _ in 0..8 {
        assert_eq!(again.to_safetensors().unwrap(), first);
    }
    let header_len = u64::from_le_bytes(first[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&first[8..8 + header_len]).unwrap();
    let meta = header.find("\"__metadata__\"").unwrap();
    let keys: Vec<usize> = ["d_model", "heads", "layers", "model", "seq_len", "vocab"]
        .iter()
        .map(|k| header[meta..].find(&format!("\"{k}\"")).unwrap())
        .collect();
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "{header}");
}

#[test]
fn bad_files_and_mismatched_flags_are_errors() {
    assert!(matches!(
        GptWeights::from_safetensors(b"nonsense", DType::F32),
        Err(WeightsError::Format(_))
    ));
    // A file without metadata.
    let t = Tensor::zeros((2, 2), DType::F32, &Device::Cpu).unwrap();
    let bare = safetensors::serialize([("x", &t)], None).unwrap();
    let err = GptWeights::from_safetensors(&bare, DType::F32).unwrap_err();
    assert!(err.to_string().contains("model"), "{err}");
    // A tensor of the wrong shape.
    let w = GptWeights::random(&config(), 1).unwrap();
    let mut tensors: HashMap<String, Tensor> = tensor_names(&config())
        .into_iter()
        .map(|(n, _)| (n.clone(), w.get(&n).unwrap().clone()))
        .collect();
    tensors.insert(
        "norm_f.weight".into(),
        Tensor::zeros(9, DType::F64, &Device::Cpu).unwrap(),
    );
    let err = GptWeights::from_tensors(&config(), tensors).unwrap_err();
    assert!(err.to_string().contains("norm_f.weight"), "{err}");

    let c = config();
    c.check_field("d_model", None).unwrap();
    c.check_field("d_model", Some(8)).unwrap();
    let err = c.check_field("d_model", Some(64)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "`d_model` is 64 but the weights file has d_model = 8; leave it unset or make it 8"
    );
    assert!(c.check_field("heads", Some(4)).is_err());
    assert!(GptConfig { heads: 3, ..c }.validate().is_err());
    assert!(GptConfig {
        d_model: usize::MAX / 2,
        ..c
    }
    .validate()
    .is_err());
}
