//! The wire format of messages between processes: stamps, tensors as (dtype, shape, bytes).
//!
//! Every message carries a [`Stamp`]: the step it belongs to and what it is: a forward or a
//! backward tensor of one chunk (direction, stage, micro-batch), a stage's gradients for the
//! DualPipe exchange, a rank's losses for the loss reduction. The receiver matches on the
//! whole stamp, so reordering on the wire can never mix micro-batches or steps.
//!
//! A tensor crosses as a [`WireData`]: element type, shape and little-endian bytes. A stage's
//! tensor type implements [`WireTensor`] to convert itself; the conversion takes the tensor by
//! value so a type that already holds its bytes hands them over without a copy.
//!
//! A message is a small header (the stamp, the sender, the tensors' dtypes and shapes) and one
//! body with the tensors' bytes back to back.

use std::fmt;

/// What a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// Activations for the forward of the stamped chunk.
    Forward,
    /// The output gradient for the backward of the stamped chunk.
    Backward,
    /// A stage copy's parameter gradients, for summing the copies (`stage` = model stage,
    /// `dir` = the sender's copy).
    Gradients,
    /// A rank's micro-batch losses and measured timeline, for the loss reduction (`stage` =
    /// the sending rank).
    Losses,
    /// An empty message that only says "the sender got here" (`stage` = the sending rank).
    Barrier,
    /// A process's part of an all-gather (`stage` = the sending rank, `dir` = the gather's
    /// round within the step).
    Gather,
}

impl Class {
    const ALL: [Class; 6] = [
        Class::Forward,
        Class::Backward,
        Class::Gradients,
        Class::Losses,
        Class::Barrier,
        Class::Gather,
    ];

    fn code(self) -> u8 {
        Class::ALL.iter().position(|c| *c == self).unwrap_or(0) as u8
    }

    fn from_code(code: u8) -> Option<Class> {
        Class::ALL.get(code as usize).copied()
    }

    /// `F`, `B`, `GRAD`, `LOSS`, `BARRIER`, `GATHER`.
    pub fn name(self) -> &'static str {
        match self {
            Class::Forward => "F",
            Class::Backward => "B",
            Class::Gradients => "GRAD",
            Class::Losses => "LOSS",
            Class::Barrier => "BARRIER",
            Class::Gather => "GATHER",
        }
    }
}

/// The name of one message: its step and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stamp {
    /// The training step (0 for the first).
    pub step: u64,
    /// What the message carries.
    pub class: Class,
    /// Direction of the consuming chunk (or of the sending stage copy).
    pub dir: usize,
    /// Stage of the consuming chunk (or the model stage, or the sending rank).
    pub stage: usize,
    /// Micro-batch of the consuming chunk (0 when the class has none).
    pub mb: usize,
}

impl Stamp {
    /// The stamp of a chunk's forward or backward input.
    pub fn chunk(step: u64, class: Class, dir: usize, stage: usize, mb: usize) -> Self {
        Stamp {
            step,
            class,
            dir,
            stage,
            mb,
        }
    }
}

impl fmt::Display for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.class {
            Class::Forward | Class::Backward => write!(
                f,
                "{} (dir {}, stage {}, mb {}) of step {}",
                self.class.name(),
                self.dir,
                self.stage,
                self.mb,
                self.step
            ),
            Class::Gradients => write!(
                f,
                "GRAD of stage {} (copy of dir {}) of step {}",
                self.stage, self.dir, self.step
            ),
            _ => write!(
                f,
                "{} of rank {} of step {}",
                self.class.name(),
                self.stage,
                self.step
            ),
        }
    }
}

/// Element type of a tensor on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireDType {
    /// Bytes.
    U8,
    /// 32-bit unsigned integers.
    U32,
    /// 64-bit signed integers.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// 32-bit floats.
    F32,
    /// 64-bit floats.
    F64,
}

impl WireDType {
    const ALL: [WireDType; 7] = [
        WireDType::U8,
        WireDType::U32,
        WireDType::I64,
        WireDType::F16,
        WireDType::BF16,
        WireDType::F32,
        WireDType::F64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            WireDType::U8 => 1,
            WireDType::F16 | WireDType::BF16 => 2,
            WireDType::U32 | WireDType::F32 => 4,
            WireDType::I64 | WireDType::F64 => 8,
        }
    }

    fn code(self) -> u8 {
        WireDType::ALL.iter().position(|d| *d == self).unwrap_or(0) as u8
    }

    fn from_code(code: u8) -> Option<WireDType> {
        WireDType::ALL.get(code as usize).copied()
    }
}

/// A tensor on the wire: element type, shape and the elements' little-endian bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireData {
    /// Element type.
    pub dtype: WireDType,
    /// Dimensions, outermost first (empty for a scalar).
    pub shape: Vec<usize>,
    /// `shape.product() * dtype.size()` bytes, row-major, little-endian.
    pub bytes: Vec<u8>,
}

impl WireData {
    /// A tensor, checking that the bytes fit the shape.
    pub fn new(dtype: WireDType, shape: Vec<usize>, bytes: Vec<u8>) -> Result<Self, WireError> {
        let data = WireData {
            dtype,
            shape,
            bytes,
        };
        data.check()?;
        Ok(data)
    }

    /// A one-dimensional f64 tensor.
    pub fn from_f64s(values: &[f64]) -> Self {
        WireData {
            dtype: WireDType::F64,
            shape: vec![values.len()],
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// The elements of an f64 tensor.
    pub fn to_f64s(&self) -> Result<Vec<f64>, WireError> {
        if self.dtype != WireDType::F64 {
            return Err(WireError(format!(
                "expected f64 values, got {:?} elements",
                self.dtype
            )));
        }
        self.check()?;
        Ok(self
            .bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect())
    }

    /// Number of elements (the product of the shape).
    pub fn elements(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// Checks that the byte count is `elements * dtype.size()`.
    pub fn check(&self) -> Result<(), WireError> {
        let expected = self
            .elements()
            .and_then(|n| n.checked_mul(self.dtype.size()));
        if expected != Some(self.bytes.len()) {
            return Err(WireError(format!(
                "a {:?} tensor of shape {:?} needs {} bytes but {} arrived",
                self.dtype,
                self.shape,
                expected.map_or("too many".into(), |n| n.to_string()),
                self.bytes.len()
            )));
        }
        Ok(())
    }
}

/// A malformed message or a tensor that cannot cross the wire.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WireError(pub String);

/// A tensor type that can cross process boundaries as (dtype, shape, bytes).
///
/// `dualpipe-nn` implements it for its candle tensors; the runtime implements it for `()`
/// (the tensors of [`SleepStage`](crate::SleepStage)) and for [`WireData`] itself.
pub trait WireTensor: Sized {
    /// The tensor as element type, shape and little-endian bytes.
    fn into_wire(self) -> Result<WireData, WireError>;

    /// The tensor back from the wire (the shape and byte count are already checked).
    fn from_wire(data: WireData) -> Result<Self, WireError>;
}

impl WireTensor for WireData {
    fn into_wire(self) -> Result<WireData, WireError> {
        Ok(self)
    }

    fn from_wire(data: WireData) -> Result<Self, WireError> {
        Ok(data)
    }
}

impl WireTensor for () {
    fn into_wire(self) -> Result<WireData, WireError> {
        Ok(WireData {
            dtype: WireDType::U8,
            shape: vec![0],
            bytes: Vec::new(),
        })
    }

    fn from_wire(data: WireData) -> Result<Self, WireError> {
        if data.bytes.is_empty() {
            Ok(())
        } else {
            Err(WireError(format!(
                "expected an empty tensor, got {} bytes",
                data.bytes.len()
            )))
        }
    }
}

/// What a message header announces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Header {
    /// Tensors for `stamp`, sent by rank `src`; their bytes follow back to back in the body.
    Data {
        /// The message's name.
        stamp: Stamp,
        /// The sending rank.
        src: usize,
        /// Element type and shape of each tensor, in order.
        tensors: Vec<(WireDType, Vec<usize>)>,
    },
    /// Rank `rank` failed with `message`: every receiver stops.
    Abort {
        /// The failed rank.
        rank: usize,
        /// Its error.
        message: String,
    },
}

const MAGIC: [u8; 4] = *b"DPW1";
const DATA: u8 = 1;
const ABORT: u8 = 2;

impl Header {
    /// The header's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&MAGIC);
        match self {
            Header::Data {
                stamp,
                src,
                tensors,
            } => {
                out.push(DATA);
                out.push(stamp.class.code());
                put(&mut out, stamp.step);
                for v in [stamp.dir, stamp.stage, stamp.mb, *src, tensors.len()] {
                    put(&mut out, v as u64);
                }
                for (dtype, shape) in tensors {
                    out.push(dtype.code());
                    put(&mut out, shape.len() as u64);
                    for &d in shape {
                        put(&mut out, d as u64);
                    }
                }
            }
            Header::Abort { rank, message } => {
                out.push(ABORT);
                out.push(0);
                put(&mut out, *rank as u64);
                put(&mut out, message.len() as u64);
                out.extend_from_slice(message.as_bytes());
            }
        }
        out
    }

    /// Parses a header.
    pub fn decode(bytes: &[u8]) -> Result<Header, WireError> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(4)? != MAGIC {
            return Err(WireError(
                "a message without the dualpipe header arrived (another program on the same \
                 communicator, or a version mismatch between the ranks' binaries)"
                    .into(),
            ));
        }
        let kind = r.byte()?;
        let class = r.byte()?;
        match kind {
            DATA => {
                let class = Class::from_code(class)
                    .ok_or_else(|| WireError(format!("unknown message class {class}")))?;
                let step = r.u64()?;
                let dir = r.usize()?;
                let stage = r.usize()?;
                let mb = r.usize()?;
                let src = r.usize()?;
                let count = r.usize()?;
                let mut tensors = Vec::new();
                for _ in 0..count {
                    let code = r.byte()?;
                    let dtype = WireDType::from_code(code)
                        .ok_or_else(|| WireError(format!("unknown element type code {code}")))?;
                    let ndim = r.usize()?;
                    if ndim > 64 {
                        return Err(WireError(format!("a tensor with {ndim} dimensions")));
                    }
                    let shape = (0..ndim).map(|_| r.usize()).collect::<Result<_, _>>()?;
                    tensors.push((dtype, shape));
                }
                r.end()?;
                Ok(Header::Data {
                    stamp: Stamp {
                        step,
                        class,
                        dir,
                        stage,
                        mb,
                    },
                    src,
                    tensors,
                })
            }
            ABORT => {
                let rank = r.usize()?;
                let len = r.usize()?;
                let message = String::from_utf8_lossy(r.take(len)?).into_owned();
                r.end()?;
                Ok(Header::Abort { rank, message })
            }
            other => Err(WireError(format!("unknown message kind {other}"))),
        }
    }
}

/// Packs tensors into one header and one body (their bytes back to back). A single tensor's
/// bytes become the body without a copy.
pub fn pack(stamp: Stamp, src: usize, tensors: Vec<WireData>) -> (Vec<u8>, Vec<u8>) {
    let shapes = tensors.iter().map(|t| (t.dtype, t.shape.clone())).collect();
    let header = Header::Data {
        stamp,
        src,
        tensors: shapes,
    }
    .encode();
    let body = if tensors.len() == 1 {
        tensors
            .into_iter()
            .next()
            .map(|t| t.bytes)
            .unwrap_or_default()
    } else {
        let mut body = Vec::with_capacity(tensors.iter().map(|t| t.bytes.len()).sum());
        for t in &tensors {
            body.extend_from_slice(&t.bytes);
        }
        body
    };
    (header, body)
}

/// Splits a body into the tensors a header announced.
pub fn unpack(
    tensors: &[(WireDType, Vec<usize>)],
    body: Vec<u8>,
) -> Result<Vec<WireData>, WireError> {
    let mut sizes = Vec::with_capacity(tensors.len());
    for (dtype, shape) in tensors {
        let n = shape
            .iter()
            .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
            .ok_or_else(|| WireError(format!("a tensor of shape {shape:?} is too large")))?;
        sizes.push(n);
    }
    let total = sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b));
    if total != Some(body.len()) {
        return Err(WireError(format!(
            "the header announces {} bytes of tensors but the body has {}",
            total.map_or("too many".into(), |t| t.to_string()),
            body.len()
        )));
    }
    if tensors.len() == 1 {
        let (dtype, shape) = tensors[0].clone();
        return Ok(vec![WireData {
            dtype,
            shape,
            bytes: body,
        }]);
    }
    let mut at = 0;
    Ok(tensors
        .iter()
        .zip(sizes)
        .map(|((dtype, shape), n)| {
            let bytes = body[at..at + n].to_vec();
            at += n;
            WireData {
                dtype: *dtype,
                shape: shape.clone(),
                bytes,
            }
        })
        .collect())
}

fn put(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| WireError("a truncated message header".into()))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn byte(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes([
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
        ]))
    }

    fn usize(&mut self) -> Result<usize, WireError> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| WireError(format!("a header field {v} is too large")))
    }

    fn end(&self) -> Result<(), WireError> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(WireError(format!(
                "{} unexpected bytes after the message header",
                self.bytes.len() - self.at
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn data(dtype: WireDType, shape: Vec<usize>, seed: u8) -> WireData {
        let n: usize = shape.iter().product::<usize>() * dtype.size();
        WireData::new(
            dtype,
            shape,
            (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect(),
        )
        .unwrap()
    }

    #[test]
    fn a_single_tensor_round_trips_without_copying_its_bytes() {
        let t = data(WireDType::F32, vec![3, 5], 7);
        let ptr = t.bytes.as_ptr();
        let stamp = Stamp::chunk(4, Class::Forward, 1, 2, 3);
        let expected = t.clone();
        let (header, body) = pack(stamp, 2, vec![t]);
        assert_eq!(body.as_ptr(), ptr, "the body is the tensor's own buffer");
        let Header::Data {
            stamp: got,
            src,
            tensors,
        } = Header::decode(&header).unwrap()
        else {
            panic!("not a data header");
        };
        assert_eq!((got, src), (stamp, 2));
        let back = unpack(&tensors, body).unwrap();
        assert_eq!(back, vec![expected]);
        assert_eq!(
            back[0].bytes.as_ptr(),
            ptr,
            "unpacking does not copy either"
        );
    }

    #[test]
    fn abort_headers_round_trip() {
        let h = Header::Abort {
            rank: 3,
            message: "rank 3: F (dir 0, stage 3, mb 1) failed: boom".into(),
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn malformed_headers_are_errors_not_panics() {
        let h = Header::Data {
            stamp: Stamp::chunk(0, Class::Backward, 0, 1, 0),
            src: 1,
            tensors: vec![(WireDType::F64, vec![2, 2])],
        }
        .encode();
        for cut in 0..h.len() {
            assert!(Header::decode(&h[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = h.clone();
        extra.push(0);
        assert!(Header::decode(&extra).is_err());
        assert!(Header::decode(b"XXXX\x01\x00").is_err());
        let Header::Data { tensors, .. } = Header::decode(&h).unwrap() else {
            panic!()
        };
        assert!(unpack(&tensors, vec![0; 31]).is_err());
    }

    #[test]
    fn wire_data_checks_its_byte_count() {
        assert!(WireData::new(WireDType::F64, vec![2], vec![0; 15]).is_err());
        assert!(WireData::new(WireDType::F64, vec![usize::MAX, 2], vec![]).is_err());
        let v = WireData::from_f64s(&[1.5, -2.0, f64::MIN_POSITIVE]);
        assert_eq!(v.to_f64s().unwrap(), vec![1.5, -2.0, f64::MIN_POSITIVE]);
        assert!(data(WireDType::F32, vec![2], 0).to_f64s().is_err());
        assert_eq!(<()>::from_wire(().into_wire().unwrap()), Ok(()));
    }

    proptest! {
        #[test]
        fn any_tensor_list_round_trips(
            step in any::<u64>(),
            dir in 0usize..2,
            stage in 0usize..1000,
            mb in 0usize..100_000,
            src in 0usize..4096,
            shapes in proptest::collection::vec(
                (0usize..7, proptest::collection::vec(0usize..6, 0..4)), 0..5),
        ) {
            let tensors: Vec<WireData> = shapes
                .iter()
                .enumerate()
                .map(|(i, (code, shape))| data(WireDType::ALL[*code], shape.clone(), i as u8))
                .collect();
            let stamp = Stamp::chunk(step, Class::Gradients, dir, stage, mb);
            let (header, body) = pack(stamp, src, tensors.clone());
            let Header::Data { stamp: got, src: from, tensors: metas } =
                Header::decode(&header).unwrap() else { panic!() };
            prop_assert_eq!(got, stamp);
            prop_assert_eq!(from, src);
            prop_assert_eq!(unpack(&metas, body).unwrap(), tensors);
        }
    }
}
