//! The wire format (the same as `python/nearline/server_wire.py`, which the
//! client reads with): an array is a JSON list (nested for a matrix) or
//! `{"dtype": "float32"|"int64", "shape": [n, d], "b64": "..."}` holding its
//! little-endian bytes; JSON has no NaN or infinity, so a request holding
//! them is refused and a result slot with no neighbour is `null` in a list
//! (`inf` in a base64 array). Errors are `{"error", "type", "status"}`.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::{Map, Value};

/// A refused request: the HTTP status, the message, and the kind of error
/// (the name the Python client raises: `ValueError`, `TypeError`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct HttpError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
}

impl HttpError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        HttpError {
            status,
            message: message.into(),
            kind: "ValueError",
        }
    }

    /// A 400 for a value of the wrong type.
    pub fn type_error(message: impl Into<String>) -> Self {
        HttpError {
            status: 400,
            message: message.into(),
            kind: "TypeError",
        }
    }

    pub fn with_kind(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }

    /// The JSON body of the reply.
    pub fn body(&self) -> Vec<u8> {
        let v =
            serde_json::json!({"error": self.message, "type": self.kind, "status": self.status});
        v.to_string().into_bytes()
    }
}

impl From<nearline::Error> for HttpError {
    /// An engine refusal: a bad argument is the caller's (400), anything
    /// else (I/O, a corrupt file) is the server's (500).
    fn from(e: nearline::Error) -> Self {
        match e {
            nearline::Error::InvalidArgument(m) => HttpError::new(400, m),
            nearline::Error::Corrupt { .. } => {
                HttpError::new(500, e.to_string()).with_kind("CorruptIndexError")
            }
            nearline::Error::Format { .. } | nearline::Error::Version { .. } => {
                HttpError::new(500, e.to_string()).with_kind("FormatError")
            }
            nearline::Error::Io { .. } => HttpError::new(500, e.to_string()).with_kind("OSError"),
            nearline::Error::Cancelled | nearline::Error::Engine(_) => {
                HttpError::new(500, e.to_string()).with_kind("RuntimeError")
            }
        }
    }
}

/// The JSON type of a value, for messages.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

/// A request body as a JSON object (serde_json refuses NaN and Infinity,
/// which are not JSON, and nesting deeper than 128).
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, HttpError> {
    if body.is_empty() {
        return Ok(Map::new());
    }
    let text = std::str::from_utf8(body)
        .map_err(|e| HttpError::new(400, format!("the body is not UTF-8: {e}")))?;
    let v: Value = serde_json::from_str(text)
        .map_err(|e| HttpError::new(400, format!("the body is not valid JSON: {e}")))?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(HttpError::new(
            400,
            format!("the body must be a JSON object, not {}", type_name(&other)),
        )),
    }
}

/// A float32 array of 1 or 2 dimensions from a request: its values (row
/// major), its shape and whether it was 1-D. Refused: another dtype or
/// shape, more than `max_items` values, a value that is not finite in
/// float32.
pub fn f32_rows(
    v: &Value,
    name: &str,
    max_items: usize,
) -> Result<(Vec<f32>, Vec<usize>), HttpError> {
    let (data, shape) = match v {
        Value::Object(m) => {
            let raw = b64_object(m, name, "float32", max_items)?;
            let data: Vec<f32> = raw
                .0
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (data, raw.1)
        }
        Value::Array(rows) => list_rows(rows, name, max_items)?,
        other => {
            return Err(HttpError::new(
                400,
                format!(
                    "{name} must be a list or a base64 array object, not {}",
                    type_name(other)
                ),
            ))
        }
    };
    if shape.is_empty() || shape.len() > 2 {
        return Err(HttpError::new(
            400,
            format!("{name} must have 1 or 2 dimension(s), got shape {shape:?}"),
        ));
    }
    if data.iter().any(|x| !x.is_finite()) {
        return Err(HttpError::new(
            400,
            format!("{name} holds a value that is not finite in float32"),
        ));
    }
    Ok((data, shape))
}

/// `(bytes, shape)` of a base64 array object.
fn b64_object(
    m: &Map<String, Value>,
    name: &str,
    dtype: &str,
    max_items: usize,
) -> Result<(Vec<u8>, Vec<usize>), HttpError> {
    let mut keys: Vec<&str> = m.keys().map(String::as_str).collect();
    keys.sort_unstable();
    if keys != ["b64", "dtype", "shape"] {
        return Err(HttpError::new(
            400,
            format!(
                "{name}: a base64 array has exactly the keys dtype, shape and b64, got {keys:?}"
            ),
        ));
    }
    if m.get("dtype").and_then(Value::as_str) != Some(dtype) {
        return Err(HttpError::new(
            400,
            format!("{name}: dtype must be '{dtype}', got {}", m["dtype"]),
        ));
    }
    let bad_shape = || {
        HttpError::new(
            400,
            format!(
                "{name}: shape must be a list of 1 or 2 non-negative integers, got {}",
                m["shape"]
            ),
        )
    };
    let shape: Vec<usize> = match &m["shape"] {
        Value::Array(s) if !s.is_empty() && s.len() <= 2 => s
            .iter()
            .map(|x| x.as_u64().and_then(|x| usize::try_from(x).ok()))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(bad_shape)?,
        _ => return Err(bad_shape()),
    };
    let items = shape
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .filter(|&n| n <= max_items)
        .ok_or_else(|| {
            HttpError::new(
                413,
                format!("{name}: {shape:?} values exceed this server's limit of {max_items}"),
            )
        })?;
    let Some(text) = m["b64"].as_str() else {
        return Err(HttpError::new(400, format!("{name}: b64 must be a string")));
    };
    let raw = STANDARD
        .decode(text)
        .map_err(|e| HttpError::new(400, format!("{name}: b64 is not valid base64: {e}")))?;
    let want = items * 4;
    if raw.len() != want {
        return Err(HttpError::new(
            400,
            format!(
                "{name}: shape {shape:?} needs {want} bytes of {dtype}, b64 holds {}",
                raw.len()
            ),
        ));
    }
    Ok((raw, shape))
}

/// A number of a list as float32 (an integer too; out of range → inf, then
/// refused as not finite).
fn number(x: &Value, name: &str) -> Result<f32, HttpError> {
    match x {
        Value::Number(n) => Ok(n.as_f64().unwrap_or(f64::INFINITY) as f32),
        other => Err(HttpError::new(
            400,
            format!("{name} must hold only numbers, found {}", type_name(other)),
        )),
    }
}

/// A list of numbers or a list of equal-length lists of numbers.
fn list_rows(
    rows: &[Value],
    name: &str,
    max_items: usize,
) -> Result<(Vec<f32>, Vec<usize>), HttpError> {
    let nested = matches!(rows.first(), Some(Value::Array(_)));
    let total: usize = if nested {
        rows.iter().map(|r| r.as_array().map_or(1, Vec::len)).sum()
    } else {
        rows.len()
    };
    if total > max_items {
        return Err(HttpError::new(
            413,
            format!("{name}: {total} values exceed this server's limit of {max_items}"),
        ));
    }
    if !nested {
        let data = rows
            .iter()
            .map(|x| number(x, name))
            .collect::<Result<_, _>>()?;
        return Ok((data, vec![rows.len()]));
    }
    let mut data = Vec::with_capacity(total);
    let mut width = None;
    for r in rows {
        let Value::Array(r) = r else {
            return Err(HttpError::new(
                400,
                format!("{name} mixes lists and numbers"),
            ));
        };
        if *width.get_or_insert(r.len()) != r.len() {
            return Err(HttpError::new(
                400,
                format!(
                    "{name} is not a rectangular array: rows of {} and {} values",
                    width.unwrap_or(0),
                    r.len()
                ),
            ));
        }
        for x in r {
            if x.is_array() {
                return Err(HttpError::new(
                    400,
                    format!("{name} must have 1 or 2 dimension(s)"),
                ));
            }
            data.push(number(x, name)?);
        }
    }
    Ok((data, vec![rows.len(), width.unwrap_or(0)]))
}

/// A float32 result array: base64 (exact, infinities kept) or lists
/// (a value that is not finite becomes null).
pub fn encode_f32(values: &[f32], shape: &[usize], b64: bool) -> Value {
    if b64 {
        let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        return b64_value("float32", shape, &bytes);
    }
    let one = |x: &f32| {
        if x.is_finite() {
            serde_json::Number::from_f64(f64::from(*x)).map_or(Value::Null, Value::Number)
        } else {
            Value::Null
        }
    };
    nest(values, shape, one)
}

/// An int64 result array: base64 or lists.
pub fn encode_i64(values: &[i64], shape: &[usize], b64: bool) -> Value {
    if b64 {
        let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        return b64_value("int64", shape, &bytes);
    }
    nest(values, shape, |x| Value::from(*x))
}

fn b64_value(dtype: &str, shape: &[usize], bytes: &[u8]) -> Value {
    serde_json::json!({"dtype": dtype, "shape": shape, "b64": STANDARD.encode(bytes)})
}

fn nest<T>(values: &[T], shape: &[usize], one: impl Fn(&T) -> Value) -> Value {
    match shape {
        [_, cols] if *cols > 0 => Value::Array(
            values
                .chunks(*cols)
                .map(|r| Value::Array(r.iter().map(&one).collect()))
                .collect(),
        ),
        [rows, _] => Value::Array((0..*rows).map(|_| Value::Array(vec![])).collect()),
        _ => Value::Array(values.iter().map(one).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_and_base64_decode_to_the_same_rows() {
        let list = json!([[1.0, 2.5], [3, -4.0]]);
        let (a, s) = f32_rows(&list, "queries", 100).unwrap();
        assert_eq!(s, vec![2, 2]);
        assert_eq!(a, vec![1.0, 2.5, 3.0, -4.0]);
        let enc = encode_f32(&a, &s, true);
        let (b, t) = f32_rows(&enc, "queries", 100).unwrap();
        assert_eq!((a, s), (b, t));
        let (one, s1) = f32_rows(&json!([0.5, 1]), "q", 10).unwrap();
        assert_eq!((one, s1), (vec![0.5, 1.0], vec![2]));
    }

    #[test]
    fn bad_arrays_are_refused_with_their_status() {
        let cases = [
            (json!("x"), 400),
            (json!([[1.0], [1.0, 2.0]]), 400),
            (json!([[1.0], 2.0]), 400),
            (json!(["a"]), 400),
            (json!([1e300]), 400),
            (json!([[[1.0]]]), 400),
            (
                json!({"dtype": "int64", "shape": [1], "b64": "AAAAAAAAAAA="}),
                400,
            ),
            (
                json!({"dtype": "float32", "shape": [2], "b64": "AAAAAA=="}),
                400,
            ),
            (json!({"dtype": "float32", "shape": [1], "b64": "!!"}), 400),
            (json!({"dtype": "float32", "shape": [-1], "b64": ""}), 400),
            (
                json!({"dtype": "float32", "shape": [1000, 1000], "b64": ""}),
                413,
            ),
            (json!(vec![1.0; 11]), 413),
        ];
        for (v, status) in cases {
            let e = f32_rows(&v, "queries", 10).unwrap_err();
            assert_eq!(e.status, status, "{v}: {}", e.message);
        }
        let nan = encode_f32(&[f32::NAN], &[1], true);
        assert_eq!(f32_rows(&nan, "q", 10).unwrap_err().status, 400);
    }

    #[test]
    fn results_in_lists_turn_missing_slots_into_null() {
        let v = encode_f32(&[1.0, f32::INFINITY], &[1, 2], false);
        assert_eq!(v, json!([[1.0, null]]));
        assert_eq!(encode_i64(&[3, -1], &[2], false), json!([3, -1]));
        assert_eq!(encode_i64(&[], &[2, 0], false), json!([[], []]));
    }

    #[test]
    fn bodies_must_be_json_objects() {
        assert!(parse_object(b"").unwrap().is_empty());
        for bad in [&b"[1]"[..], b"{", b"{\"a\": NaN}", b"\xff"] {
            assert_eq!(parse_object(bad).unwrap_err().status, 400);
        }
    }
}
