//! The request readers on arbitrary input: a body's bytes, JSON values of
//! any shape where arrays and options are expected, base64 objects with any
//! dtype, shape and payload. Each must answer `Ok` or a 4xx, never panic,
//! and never allocate from a declared size it has not checked (a shape of
//! 2^60 values is a 413 before any decode).

use nearline::planner::reader;
use nearline::planner::schema::{option_names, Stage};
use nearline_http::options::JsonOptions;
use nearline_http::wire::{f32_rows, parse_object};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// JSON values up to a few levels deep, with numbers at the edges of f32
/// and i64, and strings that look like option values.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop_oneof![
            any::<f64>(),
            Just(f64::from(f32::MAX) * 2.0),
            Just(1e-45),
            Just(-0.0)
        ]
        .prop_map(|x| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)),
        prop_oneof![
            Just("auto".to_string()),
            Just("beam".to_string()),
            Just("b64".to_string()),
            ".{0,12}".prop_map(String::from)
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 48, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A base64 array object with any dtype, shape and payload.
fn b64_object() -> impl Strategy<Value = Value> {
    (
        prop_oneof![Just("float32"), Just("int64"), Just("f4")],
        prop::collection::vec(prop_oneof![0u64..6, Just(u64::MAX), Just(1 << 60)], 0..4),
        prop_oneof![
            Just("AACAPwAAAEA=".to_string()),
            "[A-Za-z0-9+/=]{0,24}".prop_map(String::from),
            ".{0,8}".prop_map(String::from)
        ],
    )
        .prop_map(|(dtype, shape, b64)| json!({"dtype": dtype, "shape": shape, "b64": b64}))
}

fn is_refusal(status: u16) -> bool {
    (400..500).contains(&status)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("NEARLINE_FUZZ_CASES").ok().and_then(|v| v.parse::<u32>().ok()).unwrap_or(1) * 256
    ))]

    #[test]
    fn bodies_parse_or_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Err(e) = parse_object(&bytes) {
            prop_assert!(is_refusal(e.status), "{e:?}");
        }
    }

    #[test]
    fn arrays_decode_or_are_refused(v in prop_oneof![value(), b64_object()]) {
        match f32_rows(&v, "queries", 1 << 16) {
            Ok((data, shape)) => {
                prop_assert!(!shape.is_empty() && shape.len() <= 2);
                prop_assert_eq!(data.len(), shape.iter().product::<usize>());
                prop_assert!(data.iter().all(|x| x.is_finite()));
            }
            Err(e) => prop_assert!(is_refusal(e.status), "{e:?}"),
        }
    }

    #[test]
    fn options_read_or_are_refused(
        entries in prop::collection::vec(
            (prop::sample::select(option_names(Stage::Search)), value()),
            0..6,
        ),
        stray in prop::option::of(".{1,6}"),
    ) {
        let mut body: Map<String, Value> = entries
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        if let Some(k) = stray {
            body.insert(k, Value::Null);
        }
        let names = option_names(Stage::Search);
        match JsonOptions::new(&body, "search", &names, &["queries"]) {
            Ok(mut r) => {
                if let Err(e) = reader::search_options(&mut r) {
                    prop_assert!(is_refusal(e.status), "{e:?}");
                }
            }
            Err(e) => prop_assert!(is_refusal(e.status), "{e:?}"),
        }
    }
}
