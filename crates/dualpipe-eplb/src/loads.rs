//! Reading expert loads from files, and predicting the next load from a history.
//!
//! Formats, chosen by the file extension:
//! - **JSON** (`.json`): a `[layers][experts]` array of numbers, or a `[steps][layers][experts]`
//!   history; an object with a `"weight"` or `"loads"` field holding such an array is accepted
//!   too (the golden-file layout).
//! - **CSV** (`.csv`, `.txt`): one layer per line, experts separated by commas; blank lines and
//!   lines starting with `#` are skipped, and so is a first line with no numbers (a header). A
//!   UTF-8 byte-order mark is skipped; a line of numbers separated by `;` or tabs is an error
//!   that says to use commas (it is not taken for a header).
//! - **NumPy** (`.npy`): a 2-D or 3-D array of `f32`, `f64`, `i32`, `i64` (other integer
//!   widths and `u*` work too), either byte order, C or Fortran order, format versions 1 to 3.
//!   A file with more data than its shape holds is refused (the header does not describe it).
//!
//! Every load must be finite, non-negative and at most [`MAX_LOAD`] (the largest `f32`), and
//! so must every layer's sum; errors name the cell (or the layer).
//!
//! A 3-D input is a history of per-step loads; [`LoadData::predict`] turns it into one
//! `[layers][experts]` matrix with a [`Predictor`].

use std::path::{Path, PathBuf};

use crate::layout::MAX_LOAD;
use crate::matrix::LoadMatrix;
use crate::EplbError;

/// What a load file holds: one matrix, or a history of them.
#[derive(Clone, Debug, PartialEq)]
pub enum LoadData {
    /// `[layers][experts]`.
    Matrix(LoadMatrix),
    /// `[steps][layers][experts]`, oldest step first.
    History(LoadHistory),
}

/// Loads of several steps, `[steps][layers][experts]`, oldest first.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadHistory {
    steps: Vec<LoadMatrix>,
}

impl LoadHistory {
    /// A history from its steps (oldest first). Every step must have the same shape.
    pub fn new(steps: Vec<LoadMatrix>) -> Result<Self, EplbError> {
        let Some(first) = steps.first() else {
            return Err(EplbError::History(
                "the load history has no steps; give at least one [layers][experts] matrix".into(),
            ));
        };
        let shape = (first.rows(), first.cols());
        if let Some((i, m)) = steps
            .iter()
            .enumerate()
            .find(|(_, m)| (m.rows(), m.cols()) != shape)
        {
            return Err(EplbError::History(format!(
                "step {i} of the load history is {} x {} but step 0 is {} x {}; every step must cover the same layers and experts",
                m.rows(),
                m.cols(),
                shape.0,
                shape.1
            )));
        }
        Ok(Self { steps })
    }

    /// The steps, oldest first.
    pub fn steps(&self) -> &[LoadMatrix] {
        &self.steps
    }
}

/// How to predict the next step's load from a history.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum Predictor {
    /// The mean of all steps.
    #[default]
    Mean,
    /// Exponential moving average: `p = x[0]`, then `p = alpha * x[t] + (1 - alpha) * p`
    /// for each later step; `alpha` in (0, 1], larger follows recent steps more closely.
    Ema(f64),
    /// The mean of the last `n` steps (all steps when there are fewer).
    Window(usize),
}

impl Predictor {
    /// Checks the parameter: `alpha` in (0, 1], `n >= 1`.
    pub fn validate(self) -> Result<Self, EplbError> {
        match self {
            Predictor::Ema(a) if !(a > 0.0 && a <= 1.0) => Err(EplbError::History(format!(
                "EMA alpha {a} is out of range; use a value in (0, 1], e.g. 0.1"
            ))),
            Predictor::Window(0) => Err(EplbError::History(
                "a window of 0 steps predicts nothing; use a window of at least 1 step".into(),
            )),
            p => Ok(p),
        }
    }
}

impl LoadHistory {
    /// The predicted `[layers][experts]` load.
    pub fn predict(&self, predictor: Predictor) -> Result<LoadMatrix, EplbError> {
        let predictor = predictor.validate()?;
        let first = &self.steps[0];
        let mut acc = first.as_slice().to_vec();
        match predictor {
            Predictor::Mean | Predictor::Window(_) => {
                let n = match predictor {
                    Predictor::Window(n) => n.min(self.steps.len()),
                    _ => self.steps.len(),
                };
                let window = &self.steps[self.steps.len() - n..];
                acc.iter_mut().for_each(|v| *v = 0.0);
                for step in window {
                    for (a, &x) in acc.iter_mut().zip(step.as_slice()) {
                        *a += x;
                    }
                }
                acc.iter_mut().for_each(|v| *v /= n as f64);
            }
            Predictor::Ema(alpha) => {
                for step in &self.steps[1..] {
                    for (a, &x) in acc.iter_mut().zip(step.as_slice()) {
                        *a = alpha * x + (1.0 - alpha) * *a;
                    }
                }
            }
        }
        LoadMatrix::from_flat(first.rows(), first.cols(), acc)
    }
}

impl LoadData {
    /// The `[layers][experts]` load to plan for: the matrix itself, or the history's
    /// prediction. A matrix is a one-step history, so every predictor returns it unchanged.
    pub fn predict(&self, predictor: Predictor) -> Result<LoadMatrix, EplbError> {
        match self {
            LoadData::Matrix(m) => {
                predictor.validate()?;
                Ok(m.clone())
            }
            LoadData::History(h) => h.predict(predictor),
        }
    }
}

/// Reads a load file; the format comes from the extension (`.json`, `.csv`/`.txt`, `.npy`).
pub fn read_loads(path: &Path) -> Result<LoadData, EplbError> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    match ext.as_str() {
        "json" => {
            let text = read_text(path)?;
            parse_json(&text).map_err(|m| format_err(path, m))
        }
        "csv" | "txt" => {
            let text = read_text(path)?;
            parse_csv(&text)
                .map(LoadData::Matrix)
                .map_err(|m| format_err(path, m))
        }
        "npy" => {
            let bytes = dualpipe_io::read_regular(path, dualpipe_io::limits::TABLE, "load file")?;
            parse_npy(&bytes).map_err(|m| format_err(path, m))
        }
        _ => Err(format_err(
            path,
            format!(
                "unknown load file type `{}`; use .json, .csv or .npy",
                if ext.is_empty() { "(none)" } else { &ext }
            ),
        )),
    }
}

/// Reads a load file through the one input path ([`dualpipe_io::read_text`]): a regular file
/// only (a FIFO never blocks), at most [`dualpipe_io::limits::TABLE`].
fn read_text(path: &Path) -> Result<String, EplbError> {
    Ok(dualpipe_io::read_text(
        path,
        dualpipe_io::limits::TABLE,
        "load file",
    )?)
}

fn format_err(path: &Path, message: String) -> EplbError {
    EplbError::Format {
        path: PathBuf::from(path),
        message,
    }
}

/// Checks one load value; `at` describes its position for the message.
fn check_value(v: f64, at: impl FnOnce() -> String) -> Result<f64, String> {
    if (0.0..=MAX_LOAD).contains(&v) {
        Ok(v)
    } else if v.is_finite() && v > MAX_LOAD {
        Err(format!(
            "{}: load {v:e} is above the largest f32 ({:e}); scale the loads down (only their ratios matter)",
            at(),
            f32::MAX
        ))
    } else {
        Err(format!(
            "{}: load {v} is not allowed; loads must be finite and non-negative",
            at()
        ))
    }
}

/// Checks that no layer's loads add up to more than [`MAX_LOAD`]; `prefix` names the step of a
/// history (empty for a matrix).
fn check_layer_sums(m: &LoadMatrix, prefix: &str) -> Result<(), String> {
    for (l, row) in m.iter_rows().enumerate() {
        let sum: f64 = row.iter().sum();
        if sum > MAX_LOAD {
            return Err(format!(
                "{prefix}layer {l}: the loads add up to {sum:e}, above the largest f32 ({:e}); scale the loads down (only their ratios matter)",
                f32::MAX
            ));
        }
    }
    Ok(())
}

/// Parses JSON load text (a 2-D matrix or a 3-D history).
pub fn parse_json(text: &str) -> Result<LoadData, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        format!("not valid JSON ({e}); expected a [layers][experts] array of numbers")
    })?;
    let value = match value {
        serde_json::Value::Object(mut map) => match map.remove("weight").or_else(|| map.remove("loads")) {
            Some(v) => v,
            None => {
                return Err(
                    "a JSON object needs a \"weight\" or \"loads\" field holding the [layers][experts] array"
                        .into(),
                )
            }
        },
        v => v,
    };
    let serde_json::Value::Array(outer) = value else {
        return Err("expected a [layers][experts] array of numbers at the top level".into());
    };
    let is_history = matches!(
        outer.first(),
        Some(serde_json::Value::Array(inner)) if matches!(inner.first(), Some(serde_json::Value::Array(_)))
    );
    if is_history {
        let steps = outer
            .iter()
            .enumerate()
            .map(|(s, step)| json_matrix(step, &format!("step {s}, ")))
            .collect::<Result<Vec<_>, _>>()?;
        LoadHistory::new(steps)
            .map(LoadData::History)
            .map_err(|e| e.to_string())
    } else {
        json_matrix(&serde_json::Value::Array(outer), "").map(LoadData::Matrix)
    }
}

fn json_matrix(value: &serde_json::Value, prefix: &str) -> Result<LoadMatrix, String> {
    let serde_json::Value::Array(rows) = value else {
        return Err(format!("{prefix}expected an array of layers"));
    };
    let mut out = Vec::with_capacity(rows.len());
    for (r, row) in rows.iter().enumerate() {
        let serde_json::Value::Array(cells) = row else {
            return Err(format!(
                "{prefix}layer {r}: expected an array of expert loads, found {row}"
            ));
        };
        let mut vals = Vec::with_capacity(cells.len());
        for (c, cell) in cells.iter().enumerate() {
            let v = cell.as_f64().ok_or_else(|| {
                format!("{prefix}layer {r}, expert {c}: expected a number, found {cell}")
            })?;
            vals.push(check_value(v, || format!("{prefix}layer {r}, expert {c}"))?);
        }
        out.push(vals);
    }
    let m = LoadMatrix::from_rows(out).map_err(|e| format!("{prefix}{e}"))?;
    check_layer_sums(&m, prefix)?;
    Ok(m)
}

/// Parses CSV load text: one layer per line.
///
/// A UTF-8 byte-order mark at the start is skipped. A first line without numbers is a header
/// and skipped, unless it holds numbers separated by `;` or tabs: that is an error naming the
/// separator, since loads are separated by commas.
pub fn parse_csv(text: &str) -> Result<LoadMatrix, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut rows: Vec<Vec<f64>> = Vec::new();
    let mut seen_line = false;
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let cells: Vec<&str> = trimmed.split(',').map(str::trim).collect();
        let first_line = !seen_line;
        seen_line = true;
        if cells.len() == 1 {
            if let Some(sep) = [';', '\t'].into_iter().find(|&sep| {
                let parts: Vec<&str> = trimmed.split(sep).map(str::trim).collect();
                parts.len() > 1 && parts.iter().all(|p| p.parse::<f64>().is_ok())
            }) {
                let name = if sep == ';' { "`;`" } else { "tabs" };
                return Err(format!(
                    "line {line_no}: the loads are separated by {name}; separate them with commas (one layer per line)"
                ));
            }
        }
        if first_line && cells.iter().all(|c| c.parse::<f64>().is_err()) {
            continue; // a header
        }
        let mut vals = Vec::with_capacity(cells.len());
        for (c, cell) in cells.iter().enumerate() {
            let v: f64 = cell.parse().map_err(|_| {
                format!(
                    "line {line_no}, column {}: `{cell}` is not a number; write one layer per line, loads separated by commas",
                    c + 1
                )
            })?;
            vals.push(check_value(v, || {
                format!("line {line_no}, column {}", c + 1)
            })?);
        }
        if let Some(first) = rows.first() {
            if vals.len() != first.len() {
                return Err(format!(
                    "line {line_no} has {} loads but the first layer has {}; every layer must list the same experts",
                    vals.len(),
                    first.len()
                ));
            }
        }
        rows.push(vals);
    }
    let m = LoadMatrix::from_rows(rows).map_err(|e| e.to_string())?;
    check_layer_sums(&m, "")?;
    Ok(m)
}

/// Parses the bytes of a `.npy` file (2-D matrix or 3-D history).
pub fn parse_npy(bytes: &[u8]) -> Result<LoadData, String> {
    let crate::npy::NpyArray { shape, data } = crate::npy::decode(bytes)?;
    if !(shape.len() == 2 || shape.len() == 3) {
        return Err(format!(
            "the array has shape {shape:?}; expected [layers, experts] or [steps, layers, experts]"
        ));
    }
    if shape.contains(&0) {
        return Err(format!(
            "the array has shape {shape:?}, which holds no loads; every dimension must be at least 1"
        ));
    }
    let index_name = |flat: usize| -> String {
        let mut rest = flat;
        let mut idx = vec![0; shape.len()];
        for (d, &n) in shape.iter().enumerate().rev() {
            idx[d] = rest % n.max(1);
            rest /= n.max(1);
        }
        match idx.as_slice() {
            [l, e] => format!("layer {l}, expert {e}"),
            [s, l, e] => format!("step {s}, layer {l}, expert {e}"),
            other => format!("index {other:?}"),
        }
    };
    if let Some(pos) = data
        .iter()
        .position(|v| !(v.is_finite() && *v >= 0.0 && *v <= MAX_LOAD))
    {
        check_value(data[pos], || index_name(pos))?;
    }
    match *shape.as_slice() {
        [layers, experts] => {
            let m = LoadMatrix::from_flat(layers, experts, data).map_err(|e| e.to_string())?;
            check_layer_sums(&m, "")?;
            Ok(LoadData::Matrix(m))
        }
        [steps, layers, experts] => {
            let per = layers * experts;
            let mats = (0..steps)
                .map(|s| {
                    let m = LoadMatrix::from_flat(
                        layers,
                        experts,
                        data[s * per..(s + 1) * per].to_vec(),
                    )
                    .map_err(|e| e.to_string())?;
                    check_layer_sums(&m, &format!("step {s}, "))?;
                    Ok(m)
                })
                .collect::<Result<Vec<_>, String>>()?;
            LoadHistory::new(mats)
                .map(LoadData::History)
                .map_err(|e| e.to_string())
        }
        _ => unreachable!("the number of dimensions was checked above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy_bytes(descr: &str, shape: &[usize], fortran: bool, payload: &[u8]) -> Vec<u8> {
        let shape_txt = match shape {
            [a] => format!("({a},)"),
            _ => format!(
                "({})",
                shape
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let mut header = format!(
            "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape_txt}, }}",
            if fortran { "True" } else { "False" }
        );
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((header.len() as u16).to_le_bytes());
        out.extend(header.as_bytes());
        out.extend(payload);
        out
    }

    #[test]
    fn json_matrix_history_and_object() {
        let LoadData::Matrix(m) = parse_json("[[1, 2.5], [3, 4]]").unwrap() else {
            panic!("expected a matrix")
        };
        assert_eq!(m.row(1), &[3.0, 4.0]);
        let LoadData::History(h) = parse_json("[[[1,2]],[[3,4]]]").unwrap() else {
            panic!("expected a history")
        };
        assert_eq!(h.steps().len(), 2);
        assert!(matches!(
            parse_json(r#"{"weight": [[1]]}"#),
            Ok(LoadData::Matrix(_))
        ));
    }

    #[test]
    fn json_errors_name_the_place() {
        let e = parse_json("[[1, 2], [3, \"x\"]]").unwrap_err();
        assert!(e.contains("layer 1, expert 1"), "{e}");
        let e = parse_json("[[1, -2]]").unwrap_err();
        assert!(
            e.contains("layer 0, expert 1") && e.contains("non-negative"),
            "{e}"
        );
        let e = parse_json("[[1, 2], [3]]").unwrap_err();
        assert!(e.contains("ragged"), "{e}");
        assert!(parse_json("{").unwrap_err().contains("not valid JSON"));
        assert!(parse_json("[]").unwrap_err().contains("empty"));
    }

    #[test]
    fn csv_rows_header_and_errors() {
        let m = parse_csv("e0,e1,e2\n# comment\n1,2,3\n\n4, 5 ,6\n").unwrap();
        assert_eq!(m.rows(), 2);
        assert_eq!(m.row(1), &[4.0, 5.0, 6.0]);
        let e = parse_csv("1,2\n3,abc\n").unwrap_err();
        assert!(e.contains("line 2, column 2"), "{e}");
        let e = parse_csv("1,2\n3\n").unwrap_err();
        assert!(e.contains("line 2 has 1 loads"), "{e}");
        let e = parse_csv("1,nan\n").unwrap_err();
        assert!(e.contains("line 1, column 2"), "{e}");
        assert!(parse_csv("").is_err());
    }

    #[test]
    fn csv_byte_order_mark_and_separators() {
        let m = parse_csv("\u{feff}90,132,40,61\n20,107,104,64\n").unwrap();
        assert_eq!(m.row(0), &[90.0, 132.0, 40.0, 61.0]);
        let m = parse_csv("\u{feff}e0,e1\n1,2\n").unwrap();
        assert_eq!(m.rows(), 1);
        for text in ["1;2;3;4", "1;2;3;4\n5;6;7;8\n", "e0,e1\n1\t2\n"] {
            let e = parse_csv(text).unwrap_err();
            assert!(e.contains("separate them with commas"), "{text:?}: {e}");
        }
        assert!(parse_csv("1;2;3;4").unwrap_err().contains("line 1"));
    }

    #[test]
    fn loads_beyond_f32_name_the_cell_or_the_layer() {
        let e = parse_json("[[1e308, 1, 1, 1]]").unwrap_err();
        assert!(
            e.contains("layer 0, expert 0") && e.contains("largest f32"),
            "{e}"
        );
        let e = parse_json("[[1, 2], [3.5e38, 3.5e38]]").unwrap_err();
        assert!(e.contains("layer 1, expert 0"), "{e}");
        let e = parse_json("[[1, 2], [3e38, 3e38]]").unwrap_err();
        assert!(e.contains("layer 1: the loads add up to"), "{e}");
        let e = parse_json("[[[1, 2]], [[3e38, 3e38]]]").unwrap_err();
        assert!(e.contains("step 1, layer 0: the loads add up"), "{e}");
        let e = parse_csv("1,2\n3e38,1e38\n").unwrap_err();
        assert!(e.contains("layer 1: the loads add up"), "{e}");
        let e = parse_csv("1,1e39\n").unwrap_err();
        assert!(
            e.contains("line 1, column 2") && e.contains("largest f32"),
            "{e}"
        );
        assert!(parse_json("[[3.4e38, 0]]").is_ok());
    }

    #[test]
    fn npy_dtypes_orders_and_shapes() {
        let f64s: Vec<u8> = [1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let LoadData::Matrix(m) = parse_npy(&npy_bytes("<f8", &[2, 3], false, &f64s)).unwrap()
        else {
            panic!()
        };
        assert_eq!(m.row(1), &[4.0, 5.0, 6.0]);
        // Same buffer in Fortran order is the transpose's layout.
        let LoadData::Matrix(m) = parse_npy(&npy_bytes("<f8", &[2, 3], true, &f64s)).unwrap()
        else {
            panic!()
        };
        assert_eq!(m.row(0), &[1.0, 3.0, 5.0]);
        let i32s: Vec<u8> = [7i32, 8].iter().flat_map(|v| v.to_le_bytes()).collect();
        let LoadData::Matrix(m) = parse_npy(&npy_bytes("<i4", &[1, 2], false, &i32s)).unwrap()
        else {
            panic!()
        };
        assert_eq!(m.row(0), &[7.0, 8.0]);
        let i64s: Vec<u8> = [1i64, 2, 3, 4]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect();
        let LoadData::History(h) = parse_npy(&npy_bytes(">i8", &[2, 1, 2], false, &i64s)).unwrap()
        else {
            panic!()
        };
        assert_eq!(h.steps()[1].row(0), &[3.0, 4.0]);
        let f32s: Vec<u8> = [1.0f32, -1.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let e = parse_npy(&npy_bytes("<f4", &[1, 2], false, &f32s)).unwrap_err();
        assert!(e.contains("layer 0, expert 1"), "{e}");
        let e = parse_npy(&npy_bytes("<f4", &[2], false, &f32s)).unwrap_err();
        assert!(e.contains("shape"), "{e}");
        assert!(parse_npy(b"garbage").is_err());
        let huge: Vec<u8> = [1e300f64, 1.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let e = parse_npy(&npy_bytes("<f8", &[1, 2], false, &huge)).unwrap_err();
        assert!(
            e.contains("layer 0, expert 0") && e.contains("largest f32"),
            "{e}"
        );
        let sum: Vec<u8> = [3e38f32, 3e38]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let e = parse_npy(&npy_bytes("<f4", &[1, 2], false, &sum)).unwrap_err();
        assert!(e.contains("layer 0: the loads add up"), "{e}");
    }

    #[test]
    fn npy_with_an_empty_dimension_is_refused() {
        // Found by the loads_npy fuzz target: zero steps made the product of
        // the other two dimensions (which may overflow) the slice length.
        let huge = 1usize << 40;
        for shape in [vec![0, huge, huge], vec![3, 0, 2], vec![0, 2], vec![2, 0]] {
            let e = parse_npy(&npy_bytes("<f4", &shape, false, &[])).unwrap_err();
            assert!(e.contains("holds no loads"), "{shape:?}: {e}");
        }
    }

    #[test]
    fn predictors() {
        let h = LoadHistory::new(vec![
            LoadMatrix::from_rows(vec![vec![0.0, 4.0]]).unwrap(),
            LoadMatrix::from_rows(vec![vec![2.0, 0.0]]).unwrap(),
            LoadMatrix::from_rows(vec![vec![4.0, 2.0]]).unwrap(),
        ])
        .unwrap();
        assert_eq!(h.predict(Predictor::Mean).unwrap().row(0), &[2.0, 2.0]);
        assert_eq!(h.predict(Predictor::Window(2)).unwrap().row(0), &[3.0, 1.0]);
        assert_eq!(h.predict(Predictor::Window(9)).unwrap().row(0), &[2.0, 2.0]);
        // p = 0 -> 0.5*2 + 0.5*0 = 1 -> 0.5*4 + 0.5*1 = 2.5 ; 4 -> 2 -> 2
        assert_eq!(h.predict(Predictor::Ema(0.5)).unwrap().row(0), &[2.5, 2.0]);
        assert_eq!(h.predict(Predictor::Ema(1.0)).unwrap().row(0), &[4.0, 2.0]);
        assert!(h.predict(Predictor::Ema(0.0)).is_err());
        assert!(h.predict(Predictor::Ema(f64::NAN)).is_err());
        assert!(h.predict(Predictor::Window(0)).is_err());
        assert!(LoadHistory::new(vec![]).is_err());
    }
}
