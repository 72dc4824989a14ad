//! The wire codec of [`ModelStage`]'s candle tensors (either model's), so a stage can run one rank per process
//! (`dualpipe-train`'s `RankTrainer`): activations and gradients cross as (dtype, shape,
//! little-endian bytes), bit for bit.

use candle_core::{DType as CDType, Device, Tensor};
use dualpipe_runtime::transport::wire::{WireDType, WireData, WireError};
use dualpipe_runtime::WireStage;

use crate::model_stage::ModelStage;

impl WireStage for ModelStage {
    fn tensor_to_wire(tensor: Tensor) -> Result<WireData, WireError> {
        tensor_to_wire(&tensor)
    }

    fn tensor_from_wire(data: WireData) -> Result<Tensor, WireError> {
        tensor_from_wire(data)
    }
}

fn candle_error(e: candle_core::Error) -> WireError {
    WireError(format!("candle: {e}"))
}

/// A candle tensor (f32, f64, bf16 or f16) as (dtype, shape, little-endian bytes).
pub fn tensor_to_wire(tensor: &Tensor) -> Result<WireData, WireError> {
    let shape = tensor.dims().to_vec();
    let flat = tensor.flatten_all().map_err(candle_error)?;
    let (dtype, bytes) = match tensor.dtype() {
        CDType::F64 => {
            let values = flat.to_vec1::<f64>().map_err(candle_error)?;
            let mut bytes = Vec::with_capacity(values.len() * 8);
            for v in values {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            (WireDType::F64, bytes)
        }
        CDType::F32 => {
            let values = flat.to_vec1::<f32>().map_err(candle_error)?;
            let mut bytes = Vec::with_capacity(values.len() * 4);
            for v in values {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            (WireDType::F32, bytes)
        }
        CDType::BF16 => {
            let values = flat.to_vec1::<half::bf16>().map_err(candle_error)?;
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (WireDType::BF16, bytes)
        }
        CDType::F16 => {
            let values = flat.to_vec1::<half::f16>().map_err(candle_error)?;
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (WireDType::F16, bytes)
        }
        other => {
            return Err(WireError(format!(
            "tensors of {other:?} cannot cross processes; train with `dtype` f32, f64, bf16 or f16"
        )))
        }
    };
    WireData::new(dtype, shape, bytes)
}

/// A candle tensor on the CPU from (dtype, shape, bytes).
pub fn tensor_from_wire(data: WireData) -> Result<Tensor, WireError> {
    data.check()?;
    let shape = data.shape.clone();
    match data.dtype {
        WireDType::F64 => {
            let values: Vec<f64> = data
                .bytes
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .collect();
            Tensor::from_vec(values, shape, &Device::Cpu).map_err(candle_error)
        }
        WireDType::F32 => {
            let values: Vec<f32> = data
                .bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            Tensor::from_vec(values, shape, &Device::Cpu).map_err(candle_error)
        }
        WireDType::BF16 => {
            let values: Vec<half::bf16> = data
                .bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]))
                .collect();
            Tensor::from_vec(values, shape, &Device::Cpu).map_err(candle_error)
        }
        WireDType::F16 => {
            let values: Vec<half::f16> = data
                .bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]))
                .collect();
            Tensor::from_vec(values, shape, &Device::Cpu).map_err(candle_error)
        }
        other => Err(WireError(format!(
            "a {other:?} tensor arrived; stages exchange f32, f64, bf16 or f16 tensors"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candle_tensors_round_trip_exactly() {
        let t = Tensor::from_vec(
            vec![1.5f64, -0.1, 3e-300, f64::MAX, 0.0, -0.0],
            (2, 3),
            &Device::Cpu,
        )
        .unwrap();
        let back = tensor_from_wire(tensor_to_wire(&t).unwrap()).unwrap();
        assert_eq!(back.dims(), &[2, 3]);
        let bits = |t: &Tensor| -> Vec<u64> {
            t.flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        assert_eq!(bits(&back), bits(&t));
        let t32 = Tensor::from_vec(vec![0.25f32, -7.0, 1e-30], 3, &Device::Cpu).unwrap();
        let back = tensor_from_wire(tensor_to_wire(&t32).unwrap()).unwrap();
        assert_eq!(back.to_vec1::<f32>().unwrap(), vec![0.25, -7.0, 1e-30]);
        let bad = WireData::new(WireDType::U8, vec![2], vec![1, 2]).unwrap();
        assert!(tensor_from_wire(bad).is_err());
    }
}
