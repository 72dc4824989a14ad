//! Dense row-major arrays: [`Matrix`] (2-D) and [`Tensor3`] (3-D).
//!
//! Plans and loads are stored flat (one allocation each), which keeps the balancer free of
//! per-row allocations. Both types serialise as nested JSON arrays (`[[..], ..]`), the same
//! shape the reference's tensors print as, and convert to and from nested `Vec`s.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::EplbError;

/// A dense `rows x cols` matrix stored row-major in one `Vec`.
///
/// Used for loads (`Matrix<f64>`, rows = layers, columns = logical experts) and for the
/// index maps of an [`ExpertPlan`](crate::ExpertPlan) (`Matrix<i64>`).
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix<T> {
    rows: usize,
    cols: usize,
    data: Vec<T>,
}

/// Expert loads: `[layers][logical experts]`, any non-negative finite unit (tokens routed,
/// fractions, ...).
pub type LoadMatrix = Matrix<f64>;

impl<T> Matrix<T> {
    /// A matrix from its rows. Fails if there are no rows, the rows are empty, or their
    /// lengths differ.
    pub fn from_rows(rows: Vec<Vec<T>>) -> Result<Self, EplbError> {
        let cols = rows.first().map_or(0, Vec::len);
        if rows.is_empty() || cols == 0 {
            return Err(EplbError::EmptyLoads {
                layers: rows.len(),
                experts: cols,
            });
        }
        if let Some((layer, row)) = rows.iter().enumerate().find(|(_, r)| r.len() != cols) {
            return Err(EplbError::RaggedLoads {
                layer,
                len: row.len(),
                expected: cols,
            });
        }
        let n_rows = rows.len();
        let data: Vec<T> = rows.into_iter().flatten().collect();
        Ok(Self {
            rows: n_rows,
            cols,
            data,
        })
    }

    /// A matrix from a row-major buffer. Fails if `data.len() != rows * cols` or either
    /// dimension is zero.
    pub fn from_flat(rows: usize, cols: usize, data: Vec<T>) -> Result<Self, EplbError> {
        if rows == 0 || cols == 0 {
            return Err(EplbError::EmptyLoads {
                layers: rows,
                experts: cols,
            });
        }
        let expected = rows.saturating_mul(cols);
        if data.len() != expected {
            return Err(EplbError::ShapeMismatch {
                layers: rows,
                experts: cols,
                expected,
                len: data.len(),
            });
        }
        Ok(Self { rows, cols, data })
    }

    /// A matrix of `rows x cols` copies of `value` (dimensions may be zero).
    pub fn filled(rows: usize, cols: usize, value: T) -> Self
    where
        T: Clone,
    {
        Self {
            rows,
            cols,
            data: vec![value; rows * cols],
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r` as a slice. Panics if `r >= rows()`.
    pub fn row(&self, r: usize) -> &[T] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// Row `r` as a mutable slice. Panics if `r >= rows()`.
    pub fn row_mut(&mut self, r: usize) -> &mut [T] {
        &mut self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// Iterates over the rows.
    pub fn iter_rows(&self) -> impl ExactSizeIterator<Item = &[T]> + '_ {
        // `chunks_exact` with a zero size panics; a matrix with no columns has no data.
        self.data
            .chunks_exact(self.cols.max(1))
            .take(if self.cols == 0 { 0 } else { self.rows })
    }

    /// The element at (`r`, `c`), or `None` out of bounds.
    pub fn get(&self, r: usize, c: usize) -> Option<&T> {
        if r < self.rows && c < self.cols {
            self.data.get(r * self.cols + c)
        } else {
            None
        }
    }

    /// The row-major buffer.
    pub fn as_slice(&self) -> &[T] {
        &self.data
    }

    /// The row-major buffer, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.data
    }

    /// Consumes the matrix and returns its row-major buffer.
    pub fn into_flat(self) -> Vec<T> {
        self.data
    }

    /// The rows as nested `Vec`s.
    pub fn to_rows(&self) -> Vec<Vec<T>>
    where
        T: Clone,
    {
        self.iter_rows().map(<[T]>::to_vec).collect()
    }
}

impl<T> std::ops::Index<(usize, usize)> for Matrix<T> {
    type Output = T;
    fn index(&self, (r, c): (usize, usize)) -> &T {
        assert!(
            r < self.rows && c < self.cols,
            "index ({r}, {c}) out of bounds"
        );
        &self.data[r * self.cols + c]
    }
}

impl<T> TryFrom<Vec<Vec<T>>> for Matrix<T> {
    type Error = EplbError;
    fn try_from(rows: Vec<Vec<T>>) -> Result<Self, EplbError> {
        Self::from_rows(rows)
    }
}

impl<T: Serialize> Serialize for Matrix<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter_rows())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Matrix<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let rows = Vec::<Vec<T>>::deserialize(d)?;
        Self::from_rows(rows).map_err(D::Error::custom)
    }
}

/// A dense `d0 x d1 x d2` array stored row-major in one `Vec`; used for `log2phy`
/// (`[layers][logical experts][max replicas]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor3<T> {
    dims: [usize; 3],
    data: Vec<T>,
}

impl<T> Tensor3<T> {
    /// A tensor of `d0 x d1 x d2` copies of `value`.
    pub fn filled(d0: usize, d1: usize, d2: usize, value: T) -> Self
    where
        T: Clone,
    {
        Self {
            dims: [d0, d1, d2],
            data: vec![value; d0 * d1 * d2],
        }
    }

    /// The three dimensions.
    pub fn dims(&self) -> [usize; 3] {
        self.dims
    }

    /// The innermost vector at (`i`, `j`). Panics out of bounds.
    pub fn vector(&self, i: usize, j: usize) -> &[T] {
        assert!(
            i < self.dims[0] && j < self.dims[1],
            "index ({i}, {j}) out of bounds"
        );
        let start = (i * self.dims[1] + j) * self.dims[2];
        &self.data[start..start + self.dims[2]]
    }

    /// The element at (`i`, `j`, `k`), or `None` out of bounds.
    pub fn get(&self, i: usize, j: usize, k: usize) -> Option<&T> {
        if i < self.dims[0] && j < self.dims[1] && k < self.dims[2] {
            self.data.get((i * self.dims[1] + j) * self.dims[2] + k)
        } else {
            None
        }
    }

    /// The row-major buffer.
    pub fn as_slice(&self) -> &[T] {
        &self.data
    }

    /// The row-major buffer, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.data
    }

    /// As nested `Vec`s.
    pub fn to_nested(&self) -> Vec<Vec<Vec<T>>>
    where
        T: Clone,
    {
        (0..self.dims[0])
            .map(|i| {
                (0..self.dims[1])
                    .map(|j| self.vector(i, j).to_vec())
                    .collect()
            })
            .collect()
    }
}

impl<T: Serialize> Serialize for Tensor3<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let [d0, d1, _] = self.dims;
        s.collect_seq((0..d0).map(|i| Plane { t: self, i, d1 }))
    }
}

struct Plane<'a, T> {
    t: &'a Tensor3<T>,
    i: usize,
    d1: usize,
}

impl<T: Serialize> Serialize for Plane<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq((0..self.d1).map(|j| self.t.vector(self.i, j)))
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Tensor3<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let nested = Vec::<Vec<Vec<T>>>::deserialize(d)?;
        let d0 = nested.len();
        let d1 = nested.first().map_or(0, Vec::len);
        let d2 = nested.first().and_then(|p| p.first()).map_or(0, Vec::len);
        let mut data = Vec::with_capacity(d0 * d1 * d2);
        for (i, plane) in nested.into_iter().enumerate() {
            if plane.len() != d1 {
                return Err(D::Error::custom(format!(
                    "ragged 3-D array: entry {i} has {} rows, expected {d1}",
                    plane.len()
                )));
            }
            for (j, v) in plane.into_iter().enumerate() {
                if v.len() != d2 {
                    return Err(D::Error::custom(format!(
                        "ragged 3-D array: entry [{i}][{j}] has {} values, expected {d2}",
                        v.len()
                    )));
                }
                data.extend(v);
            }
        }
        Ok(Self {
            dims: [d0, d1, d2],
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_roundtrip_and_json_shape() {
        let m = Matrix::from_rows(vec![vec![1i64, 2, 3], vec![4, 5, 6]]).unwrap();
        assert_eq!(m.rows(), 2);
        assert_eq!(m.cols(), 3);
        assert_eq!(m.row(1), &[4, 5, 6]);
        assert_eq!(m[(0, 2)], 3);
        assert_eq!(m.get(2, 0), None);
        assert_eq!(serde_json::to_string(&m).unwrap(), "[[1,2,3],[4,5,6]]");
        let back: Matrix<i64> = serde_json::from_str("[[1,2,3],[4,5,6]]").unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn ragged_and_empty_rejected() {
        assert!(matches!(
            Matrix::from_rows(vec![vec![1.0], vec![1.0, 2.0]]),
            Err(EplbError::RaggedLoads {
                layer: 1,
                len: 2,
                expected: 1
            })
        ));
        assert!(matches!(
            Matrix::<f64>::from_rows(vec![]),
            Err(EplbError::EmptyLoads { .. })
        ));
        assert!(matches!(
            Matrix::<f64>::from_rows(vec![vec![]]),
            Err(EplbError::EmptyLoads { .. })
        ));
        assert!(matches!(
            Matrix::from_flat(2, 2, vec![1.0; 3]),
            Err(EplbError::ShapeMismatch { .. })
        ));
    }

    #[test]
    fn tensor3_json_roundtrip() {
        let mut t = Tensor3::filled(2, 2, 1, -1i64);
        t.as_mut_slice()[3] = 7;
        let s = serde_json::to_string(&t).unwrap();
        assert_eq!(s, "[[[-1],[-1]],[[-1],[7]]]");
        let back: Tensor3<i64> = serde_json::from_str(&s).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.to_nested()[1][1], vec![7]);
    }
}
