//! A JSON request's options as the engine's option source
//! ([`nearline::planner::reader`]): the names, fields and defaults are the
//! engine's; this file only says how a JSON value is read as each type.

use crate::wire::{type_name, HttpError};
use nearline::planner::reader::OptionReader;
use serde_json::{Map, Value};

/// The options of one request: every key but the request's own
/// (`queries`, `stats`, ...).
pub struct JsonOptions<'a> {
    body: &'a Map<String, Value>,
    accepted: &'a [&'static str],
}

impl<'a> JsonOptions<'a> {
    /// Options of `call` (named in errors): every key of `body` must be in
    /// `accepted` (the engine's options of that call) or `own` (the
    /// request's own keys), or the request is refused.
    pub fn new(
        body: &'a Map<String, Value>,
        call: &str,
        accepted: &'a [&'static str],
        own: &[&str],
    ) -> Result<Self, HttpError> {
        let mut unknown: Vec<&str> = body
            .keys()
            .map(String::as_str)
            .filter(|k| !accepted.contains(k) && !own.contains(k))
            .collect();
        if !unknown.is_empty() {
            unknown.sort_unstable();
            let mut all: Vec<&str> = accepted
                .iter()
                .copied()
                .chain(own.iter().copied())
                .collect();
            all.sort_unstable();
            return Err(HttpError::new(
                400,
                format!(
                    "unknown {call} option(s) {}; accepted: {}",
                    unknown.join(", "),
                    all.join(", ")
                ),
            ));
        }
        Ok(JsonOptions { body, accepted })
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        match self.body.get(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    fn wrong(key: &str, want: &str, v: &Value) -> HttpError {
        HttpError::type_error(format!("{key} must be {want}, not {}", type_name(v)))
    }

    fn int(&self, key: &str) -> Result<Option<i128>, HttpError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        match v {
            Value::Number(n) if n.is_i64() || n.is_u64() => {
                Ok(n.as_i64().map(i128::from).or(n.as_u64().map(i128::from)))
            }
            _ => Err(Self::wrong(key, "an integer", v)),
        }
    }
}

impl OptionReader for JsonOptions<'_> {
    type Error = HttpError;

    fn accepts(&self, key: &str) -> bool {
        self.accepted.contains(&key)
    }

    fn usize(&mut self, key: &'static str) -> Result<Option<usize>, HttpError> {
        match self.int(key)? {
            None => Ok(None),
            Some(i) if i < 0 => Err(HttpError::new(400, format!("{key}={i} must be >= 0"))),
            Some(i) => usize::try_from(i)
                .map(Some)
                .map_err(|_| HttpError::new(400, format!("{key}={i} is too large"))),
        }
    }

    fn f64(&mut self, key: &'static str) -> Result<Option<f64>, HttpError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            Some(x) => Err(HttpError::new(
                400,
                format!("{key}={x} must be a finite number"),
            )),
            None => Err(Self::wrong(key, "a number", v)),
        }
    }

    fn bool(&mut self, key: &'static str) -> Result<Option<bool>, HttpError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_bool()
            .map(Some)
            .ok_or_else(|| Self::wrong(key, "a bool", v))
    }

    fn str(&mut self, key: &'static str) -> Result<Option<String>, HttpError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_str()
            .map(|s| Some(s.to_string()))
            .ok_or_else(|| Self::wrong(key, "a string", v))
    }

    fn int_or_auto(&mut self, key: &'static str) -> Result<Option<usize>, HttpError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        if let Some(s) = v.as_str() {
            if s.trim().eq_ignore_ascii_case("auto") {
                return Ok(None);
            }
            return Err(HttpError::new(
                400,
                format!("{key}={s:?} must be 'auto' or an integer in 1..64"),
            ));
        }
        match self.int(key) {
            Ok(Some(q)) if q >= 1 => usize::try_from(q)
                .map(Some)
                .map_err(|_| HttpError::new(400, format!("{key}={q} is too large"))),
            Ok(Some(q)) => Err(HttpError::new(
                400,
                format!("{key}={q} must be in 1..64 (or 'auto')"),
            )),
            _ => Err(HttpError::type_error(format!(
                "{key} must be 'auto' or an integer"
            ))),
        }
    }

    fn engine_error(&self, e: nearline::Error) -> HttpError {
        e.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nearline::planner::reader;
    use nearline::planner::schema::{option_names, Stage};
    use serde_json::json;

    fn opts(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn search_options_read_as_the_bindings_do() {
        let names = option_names(Stage::Search);
        let body = opts(json!({"queries": [1.0], "k": 5, "L": 64, "sigma": 0.5,
                               "repeatable": false, "queries_in_flight": "auto", "W": null}));
        let mut r = JsonOptions::new(&body, "search", &names, &["queries"]).unwrap();
        let o = reader::search_options(&mut r).unwrap();
        assert_eq!((o.k, o.l, o.w, o.sigma), (5, Some(64), None, Some(0.5)));
        assert!(!o.repeatable);
        assert_eq!(o.queries_in_flight, None);
    }

    #[test]
    fn wrong_types_unknown_names_and_bad_values_are_refused() {
        let names = option_names(Stage::Search);
        let e = JsonOptions::new(&opts(json!({"kk": 1})), "search", &names, &[])
            .err()
            .unwrap();
        assert!(
            e.message.contains("unknown search option(s) kk"),
            "{}",
            e.message
        );
        for (body, kind) in [
            (json!({"k": 5.0}), "TypeError"),
            (json!({"k": "5"}), "TypeError"),
            (json!({"k": -1}), "ValueError"),
            (json!({"repeatable": 1}), "TypeError"),
            (json!({"sigma": "x"}), "TypeError"),
            (json!({"executor": "warp"}), "ValueError"),
            (json!({"queries_in_flight": 0}), "ValueError"),
            (json!({"queries_in_flight": true}), "TypeError"),
        ] {
            let b = opts(body.clone());
            let mut r = JsonOptions::new(&b, "search", &names, &[]).unwrap();
            let e = reader::search_options(&mut r).unwrap_err();
            assert_eq!((e.status, e.kind), (400, kind), "{body}: {}", e.message);
        }
    }
}
