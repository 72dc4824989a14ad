//! A minimal reader for NumPy `.npy` files: numeric dtypes, C or Fortran order.
//!
//! The format is a magic string, a version, a header length and a Python dict literal such as
//! `{'descr': '<f8', 'fortran_order': False, 'shape': (58, 256), }`, then the raw array. Only
//! what load matrices need is supported: one little- or big-endian float or integer type, no
//! structured or object arrays. (A full `.npy` crate brings a parser generator and big-integer
//! arithmetic with it, which would dominate this crate's build time.)

/// A decoded array: its shape and its values as `f64`, in C (row-major) order.
#[derive(Debug)]
pub(crate) struct NpyArray {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

/// Decodes the bytes of a `.npy` file.
pub(crate) fn decode(bytes: &[u8]) -> Result<NpyArray, String> {
    const MAGIC: &[u8] = b"\x93NUMPY";
    if bytes.len() < MAGIC.len() {
        return Err(if MAGIC.starts_with(bytes) && !bytes.is_empty() {
            format!(
                "the .npy preamble is truncated ({} bytes, the magic string alone takes 6); save the array again with numpy.save",
                bytes.len()
            )
        } else {
            "not a .npy file (the magic string \\x93NUMPY is missing); save the array with numpy.save".into()
        });
    }
    if &bytes[..6] != MAGIC {
        return Err("not a .npy file (the magic string \\x93NUMPY is missing); save the array with numpy.save".into());
    }
    let Some(&major) = bytes.get(6) else {
        return Err(preamble_truncated(bytes.len(), 8));
    };
    let length_bytes = match major {
        1 => 2,
        2 | 3 => 4,
        _ => {
            return Err(format!(
                "unsupported .npy format version {major}; save the array with numpy.save (versions 1 to 3 are read)"
            ))
        }
    };
    let start = 8 + length_bytes;
    if bytes.len() < start {
        return Err(preamble_truncated(bytes.len(), start));
    }
    let header_len = if length_bytes == 2 {
        usize::from(u16::from_le_bytes([bytes[8], bytes[9]]))
    } else {
        u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize
    };
    let header_end = start
        .checked_add(header_len)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| {
            format!(
                "the .npy header is truncated: it should take {header_len} bytes but {} follow the preamble",
                bytes.len() - start
            )
        })?;
    let header = std::str::from_utf8(&bytes[start..header_end])
        .map_err(|_| "the .npy header is not text")?;
    let dict = parse_header(header)?;
    let dtype = Dtype::parse(&dict.descr)?;
    let count = dict
        .shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or("the array shape is too large")?;
    let payload = &bytes[header_end..];
    let needed = count
        .checked_mul(dtype.size)
        .ok_or("the array shape is too large")?;
    if payload.len() < needed {
        return Err(format!(
            "the file is truncated: shape {:?} of {} needs {needed} bytes of data but {} are present",
            dict.shape,
            dict.descr,
            payload.len()
        ));
    }
    if payload.len() > needed {
        return Err(format!(
            "the file holds {} bytes of data but shape {:?} of {} needs {needed}; the header does not describe the data (save the array again with numpy.save)",
            payload.len(),
            dict.shape,
            dict.descr,
        ));
    }
    let data: Vec<f64> = payload[..needed]
        .chunks_exact(dtype.size)
        .map(|c| dtype.read(c))
        .collect();
    let data = if dict.fortran_order && dict.shape.len() > 1 {
        fortran_to_c(&data, &dict.shape)
    } else {
        data
    };
    Ok(NpyArray {
        shape: dict.shape,
        data,
    })
}

/// The message for a preamble shorter than its `needed` bytes (magic, version, header length).
fn preamble_truncated(len: usize, needed: usize) -> String {
    format!(
        "the .npy preamble is truncated ({len} bytes, this format version needs {needed} before the header); save the array again with numpy.save"
    )
}

#[derive(Debug)]
struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

#[derive(Clone, Copy)]
enum Kind {
    Float,
    Int,
    Uint,
}

struct Dtype {
    kind: Kind,
    size: usize,
    big_endian: bool,
}

impl Dtype {
    fn parse(descr: &str) -> Result<Self, String> {
        let unsupported = || {
            format!(
                "unsupported dtype '{descr}'; save the loads as float32, float64, int32 or int64"
            )
        };
        let mut chars = descr.chars();
        let (order, kind_char) = match (chars.next(), chars.next()) {
            (Some(o @ ('<' | '>' | '|' | '=')), Some(k)) => (o, k),
            _ => return Err(unsupported()),
        };
        let size: usize = chars.as_str().parse().map_err(|_| unsupported())?;
        let kind = match (kind_char, size) {
            ('f', 4 | 8) => Kind::Float,
            ('i', 1 | 2 | 4 | 8) => Kind::Int,
            ('u', 1 | 2 | 4 | 8) => Kind::Uint,
            _ => return Err(unsupported()),
        };
        Ok(Self {
            kind,
            size,
            big_endian: order == '>',
        })
    }

    fn read(&self, chunk: &[u8]) -> f64 {
        let mut b = [0u8; 8];
        b[..self.size].copy_from_slice(chunk);
        if self.big_endian {
            b[..self.size].reverse();
        }
        match (self.kind, self.size) {
            (Kind::Float, 4) => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            (Kind::Float, _) => f64::from_le_bytes(b),
            (Kind::Int, 1) => f64::from(b[0] as i8),
            (Kind::Int, 2) => f64::from(i16::from_le_bytes([b[0], b[1]])),
            (Kind::Int, 4) => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            (Kind::Int, _) => i64::from_le_bytes(b) as f64,
            (Kind::Uint, _) => u64::from_le_bytes(b) as f64,
        }
    }
}

/// Parses the header dict: `'descr'`, `'fortran_order'` and `'shape'` entries.
fn parse_header(text: &str) -> Result<Header, String> {
    let bad = |what: &str| format!("cannot read the .npy header ({what}): {}", text.trim());
    let body = text
        .trim()
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or_else(|| bad("not a dict"))?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    let mut rest = body.trim_start();
    while !rest.is_empty() {
        let (key, after) = quoted(rest).ok_or_else(|| bad("expected a quoted key"))?;
        let after = after
            .trim_start()
            .strip_prefix(':')
            .ok_or_else(|| bad("expected ':'"))?
            .trim_start();
        let after = match key {
            "descr" => {
                let (v, a) = quoted(after).ok_or_else(|| {
                    "structured dtypes are not supported; save a plain numeric array".to_string()
                })?;
                descr = Some(v.to_string());
                a
            }
            "fortran_order" => {
                if let Some(a) = after.strip_prefix("True") {
                    fortran = Some(true);
                    a
                } else if let Some(a) = after.strip_prefix("False") {
                    fortran = Some(false);
                    a
                } else {
                    return Err(bad("fortran_order is neither True nor False"));
                }
            }
            "shape" => {
                let inner = after
                    .strip_prefix('(')
                    .ok_or_else(|| bad("shape is not a tuple"))?;
                let close = inner.find(')').ok_or_else(|| bad("shape is not closed"))?;
                let dims = inner[..close]
                    .split(',')
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .map(|d| d.trim_end_matches('L').parse::<usize>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| bad("shape holds a non-integer"))?;
                shape = Some(dims);
                &inner[close + 1..]
            }
            _ => return Err(bad("unknown key")),
        };
        rest = after.trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Ok(Header {
        descr: descr.ok_or_else(|| bad("no 'descr'"))?,
        fortran_order: fortran.ok_or_else(|| bad("no 'fortran_order'"))?,
        shape: shape.ok_or_else(|| bad("no 'shape'"))?,
    })
}

/// Splits a leading `'...'` or `"..."` string off `s`.
fn quoted(s: &str) -> Option<(&str, &str)> {
    let q = s.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let end = s[1..].find(q)? + 1;
    Some((&s[1..end], &s[end + 1..]))
}

/// Reorders a column-major (Fortran) buffer of `shape` into row-major order.
fn fortran_to_c(data: &[f64], shape: &[usize]) -> Vec<f64> {
    let mut out = vec![0.0; data.len()];
    let mut idx = vec![0usize; shape.len()];
    for (c_pos, slot) in out.iter_mut().enumerate() {
        let mut rest = c_pos;
        for d in (0..shape.len()).rev() {
            idx[d] = rest % shape[d];
            rest /= shape[d];
        }
        let mut f_pos = 0;
        for d in (0..shape.len()).rev() {
            f_pos = f_pos * shape[d] + idx[d];
        }
        *slot = data[f_pos];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_variants() {
        let h =
            parse_header("{'descr': '<f8', 'fortran_order': False, 'shape': (58, 256), }     \n")
                .unwrap();
        assert_eq!(h.descr, "<f8");
        assert!(!h.fortran_order);
        assert_eq!(h.shape, vec![58, 256]);
        let h =
            parse_header("{\"shape\": (3,), \"fortran_order\": True, \"descr\": \"|u1\"}").unwrap();
        assert_eq!(h.shape, vec![3]);
        assert!(h.fortran_order);
        assert!(
            parse_header("{'descr': [('a', '<f8')], 'fortran_order': False, 'shape': (1,)}")
                .unwrap_err()
                .contains("structured")
        );
        assert!(parse_header("nonsense").is_err());
    }

    #[test]
    fn dtypes() {
        assert!(Dtype::parse("<c16").is_err());
        assert!(Dtype::parse("<f2").is_err());
        assert!(Dtype::parse("O").is_err());
        let d = Dtype::parse(">i2").unwrap();
        assert_eq!(d.read(&[0xFF, 0xFE]), -2.0);
        let d = Dtype::parse("<u4").unwrap();
        assert_eq!(d.read(&[1, 1, 0, 0]), 257.0);
    }

    #[test]
    fn truncated_data() {
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        let header = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }\n";
        bytes.extend((header.len() as u16).to_le_bytes());
        bytes.extend(header.as_bytes());
        bytes.extend([0u8; 16]);
        assert!(decode(&bytes).unwrap_err().contains("truncated"));
        // More data than the shape holds is refused, not silently ignored.
        bytes.extend([0u8; 24]);
        let e = decode(&bytes).unwrap_err();
        assert!(
            e.contains("holds 40 bytes") && e.contains("needs 32"),
            "{e}"
        );
    }

    #[test]
    fn truncated_preambles_say_so() {
        for (bytes, want) in [
            (&b"\x93NUM"[..], "preamble is truncated (4 bytes"),
            (&b"\x93NUMPY\x01\x00"[..], "needs 10"),
            (&b"\x93NUMPY\x02\x00\x00\x00"[..], "needs 12"),
            (&b"\x93NUMPY\x03"[..], "needs 12"),
            (&b"\x93NUMPY"[..], "needs 8"),
        ] {
            let e = decode(bytes).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        assert!(decode(b"\x93NUMPY\x04\x00\x00\x00\x00\x00")
            .unwrap_err()
            .contains("version 4"));
        assert!(decode(b"PK\x03").unwrap_err().contains("magic string"));
        let mut bytes = b"\x93NUMPY\x01\x00\x40\x00".to_vec();
        bytes.extend(b"{'descr'");
        assert!(decode(&bytes)
            .unwrap_err()
            .contains("should take 64 bytes but 8"));
    }
}
