//! Search options read from any source of named values: a Python call's
//! keyword arguments (the bindings) or a JSON request (the HTTP server).
//! Each source says how to read one value of a type from its own values
//! (and what to call a wrong one); which options exist, their types and
//! which struct field each fills are written once, here.

use super::options::{ExecutorChoice, PageChoice, RangeOptions, SearchOptions};

/// Typed values by option name, from one caller's options. Each method
/// marks `key` as taken and returns `None` when it is absent (or null).
pub trait OptionReader {
    /// The source's error (a Python exception, an HTTP 400).
    type Error;
    /// Whether this call accepts `key` (partition-only options are accepted
    /// by search, not by range search).
    fn accepts(&self, key: &str) -> bool;
    /// An integer ≥ 0.
    fn usize(&mut self, key: &'static str) -> Result<Option<usize>, Self::Error>;
    /// A finite number (an integer is accepted).
    fn f64(&mut self, key: &'static str) -> Result<Option<f64>, Self::Error>;
    fn bool(&mut self, key: &'static str) -> Result<Option<bool>, Self::Error>;
    fn str(&mut self, key: &'static str) -> Result<Option<String>, Self::Error>;
    /// An integer ≥ 1 or the word `auto` (`None`: the planner chooses).
    fn int_or_auto(&mut self, key: &'static str) -> Result<Option<usize>, Self::Error>;
    /// An engine refusal (an unknown name) as the source's error.
    fn engine_error(&self, e: crate::Error) -> Self::Error;
}

/// A name option parsed by the engine's vocabulary.
pub fn name<R: OptionReader, T>(
    r: &mut R,
    key: &'static str,
    parse: impl Fn(&str) -> crate::Result<T>,
) -> Result<Option<T>, R::Error> {
    match r.str(key)? {
        None => Ok(None),
        Some(s) => parse(&s).map(Some).map_err(|e| r.engine_error(e)),
    }
}

/// The search options besides `k` (range search reads them too, with
/// `k` = 1).
pub fn search_fields<R: OptionReader>(r: &mut R, k: usize) -> Result<SearchOptions, R::Error> {
    let queries_in_flight = r.int_or_auto("queries_in_flight")?;
    Ok(SearchOptions {
        k,
        l: r.usize("L")?,
        w: r.usize("W")?,
        executor: name(r, "executor", ExecutorChoice::parse)?.unwrap_or(ExecutorChoice::Auto),
        adaptive_beam: r.bool("adaptive_beam")?.unwrap_or(false),
        early_dispatch: r.f64("early_dispatch")?.map(|x| x as f32),
        queries_in_flight,
        page_search: name(r, "page_search", PageChoice::parse)?.unwrap_or(PageChoice::Auto),
        sigma: r.f64("sigma")?.map(|x| x as f32),
        refine_ratio: r.f64("refine_ratio")?.map(|x| x as f32),
        filter_ratio: r.f64("filter_ratio")?.map(|x| x as f32),
        threads: r.usize("threads")?,
        repeatable: r.bool("repeatable")?.unwrap_or(true),
        nprobe: if r.accepts("nprobe") {
            r.usize("nprobe")?
        } else {
            None
        },
        probe_cut: if r.accepts("probe_cut") {
            r.f64("probe_cut")?.map(|x| x as f32)
        } else {
            None
        },
    })
}

/// k-NN search options (`k` defaults to 10).
pub fn search_options<R: OptionReader>(r: &mut R) -> Result<SearchOptions, R::Error> {
    let k = r.usize("k")?.unwrap_or(10);
    search_fields(r, k)
}

/// Range-search options: the search options (k = 1) and the range's own.
pub fn range_options<R: OptionReader>(
    r: &mut R,
) -> Result<(SearchOptions, RangeOptions), R::Error> {
    let s = search_fields(r, 1)?;
    let range = RangeOptions {
        ratio: r.f64("ratio")?.map(|x| x as f32),
        max_l: r.usize("max_L")?,
        entry_cutoff: r.f64("entry_cutoff")?.map(|x| x as f32),
    };
    Ok((s, range))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A source of string-typed values, enough to check which keys each
    /// reader takes and where they land.
    struct Map(BTreeMap<&'static str, &'static str>, Vec<&'static str>);

    impl OptionReader for Map {
        type Error = String;
        fn accepts(&self, key: &str) -> bool {
            key != "nprobe" || self.0.contains_key("nprobe")
        }
        fn usize(&mut self, key: &'static str) -> Result<Option<usize>, String> {
            self.1.push(key);
            self.0
                .get(key)
                .map(|v| v.parse().map_err(|_| format!("{key} not an int")))
                .transpose()
        }
        fn f64(&mut self, key: &'static str) -> Result<Option<f64>, String> {
            self.1.push(key);
            self.0
                .get(key)
                .map(|v| v.parse().map_err(|_| format!("{key} not a number")))
                .transpose()
        }
        fn bool(&mut self, key: &'static str) -> Result<Option<bool>, String> {
            self.1.push(key);
            Ok(self.0.get(key).map(|v| *v == "true"))
        }
        fn str(&mut self, key: &'static str) -> Result<Option<String>, String> {
            self.1.push(key);
            Ok(self.0.get(key).map(|v| v.to_string()))
        }
        fn int_or_auto(&mut self, key: &'static str) -> Result<Option<usize>, String> {
            self.1.push(key);
            Ok(self.0.get(key).and_then(|v| v.parse().ok()))
        }
        fn engine_error(&self, e: crate::Error) -> String {
            e.to_string()
        }
    }

    #[test]
    fn every_field_is_read_from_its_declared_name() {
        let m: BTreeMap<_, _> = [
            ("k", "7"),
            ("L", "40"),
            ("W", "3"),
            ("sigma", "0.25"),
            ("threads", "2"),
            ("repeatable", "false"),
            ("queries_in_flight", "5"),
            ("executor", "beam"),
            ("nprobe", "9"),
        ]
        .into_iter()
        .collect();
        let mut r = Map(m, vec![]);
        let o = search_options(&mut r).unwrap();
        assert_eq!(o.k, 7);
        assert_eq!(o.l, Some(40));
        assert_eq!(o.w, Some(3));
        assert_eq!(o.sigma, Some(0.25));
        assert_eq!(o.threads, Some(2));
        assert!(!o.repeatable);
        assert_eq!(o.queries_in_flight, Some(5));
        assert_eq!(o.nprobe, Some(9));
        // Every name read is a search option of the schema.
        let declared = super::super::schema::option_names(super::super::schema::Stage::Search);
        for k in &r.1 {
            assert!(declared.contains(k), "{k} is not a declared search option");
        }
    }

    #[test]
    fn range_reads_its_own_options_and_refuses_unknown_names() {
        let m: BTreeMap<_, _> = [("ratio", "0.4"), ("max_L", "800")].into_iter().collect();
        let (s, r) = range_options(&mut Map(m, vec![])).unwrap();
        assert_eq!(s.k, 1);
        assert_eq!(r.ratio, Some(0.4));
        assert_eq!(r.max_l, Some(800));
        let m: BTreeMap<_, _> = [("executor", "warp")].into_iter().collect();
        let e = search_options(&mut Map(m, vec![])).unwrap_err();
        assert!(e.contains("warp"), "{e}");
    }
}
