//! The layering test: every `crate::` path in the engine's sources (test
//! modules and files named `tests.rs` or `*_tests.rs` excepted) must point
//! to a module of a lower tier than its own,
//! as the tier table in `docs/architecture.md` says, and no two source
//! files may import each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Names the crate root re-exports, and the module each comes from.
const ROOT_ITEMS: &[(&str, &str)] = &[
    ("Error", "error"),
    ("Result", "error"),
    ("DType", "elem"),
    ("Element", "elem"),
    ("Metric", "distance"),
    ("with_dtype", "elem"),
];

/// Reads the tier table between `<!-- tiers -->` and `<!-- /tiers -->`:
/// rows `| tier | `a`, `b` | ... |`.
fn read_tiers(doc: &str) -> Result<BTreeMap<String, u32>, String> {
    let start = doc
        .find("<!-- tiers -->")
        .ok_or("docs/architecture.md has no <!-- tiers --> table")?;
    let end = doc
        .find("<!-- /tiers -->")
        .ok_or("docs/architecture.md has no <!-- /tiers --> marker")?;
    let mut tiers = BTreeMap::new();
    for line in doc[start..end].lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 3 {
            continue;
        }
        let Ok(tier) = cells[1].parse::<u32>() else {
            continue;
        };
        for m in cells[2].split(',') {
            let m = m.trim().trim_matches('`');
            if !m.is_empty() {
                tiers.insert(m.to_string(), tier);
            }
        }
    }
    if tiers.is_empty() {
        return Err("the tier table is empty".into());
    }
    Ok(tiers)
}

/// The source without comments and without the items `#[cfg(test)]` marks
/// (test modules, inline or declared, and test-only functions), wherever
/// they sit in the file: the rest of the file is checked.
fn code_of(text: &str) -> String {
    let code = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::with_capacity(code.len());
    let mut rest = code.as_str();
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        rest = &rest[i + "#[cfg(test)]".len()..];
        rest = &rest[item_end(rest)..];
    }
    out.push_str(rest);
    out
}

/// Bytes of `s` up to the end of its first item: through the `}` closing
/// its first brace when a `{` comes before any `;`, else through the `;`.
/// String and character literals are skipped while counting braces.
fn item_end(s: &str) -> usize {
    let b = s.as_bytes();
    let mut i = 0;
    let mut depth = 0usize;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'\'' if i + 2 < b.len() && b[i + 2] == b'\'' => i += 2,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            b';' if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// The first path segments after `crate::` (grouped imports expanded) and
/// after `super::`.
fn paths(code: &str) -> (BTreeSet<Vec<String>>, BTreeSet<String>) {
    let ident = |s: &str| -> Vec<String> {
        s.split("::")
            .map(|p| {
                p.trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|p| !p.is_empty())
            .collect()
    };
    let mut crate_paths = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        // `$crate::` inside macros names the defining crate too.
        let after = &rest[i + 7..];
        if let Some(inner) = after.strip_prefix('{') {
            let close = inner.find('}').unwrap_or(inner.len());
            for part in inner[..close].split(',') {
                let p = ident(part);
                if !p.is_empty() {
                    crate_paths.insert(p);
                }
            }
        } else {
            let p = ident(after);
            if !p.is_empty() {
                crate_paths.insert(p);
            }
        }
        rest = after;
    }
    let mut supers = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("super::") {
        let after = &rest[i + 7..];
        if let Some(inner) = after.strip_prefix('{') {
            let close = inner.find('}').unwrap_or(inner.len());
            for part in inner[..close].split(',') {
                if let Some(p) = ident(part).first() {
                    supers.insert(p.clone());
                }
            }
        } else if let Some(p) = ident(after).first() {
            supers.insert(p.clone());
        }
        rest = after;
    }
    (crate_paths, supers)
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a source file relative to `src` (`search/executor/mod.rs`
/// → `search::executor`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

/// Every violation of the tier table in the sources under `src`.
fn violations(src: &Path, tiers: &BTreeMap<String, u32>) -> Vec<String> {
    let mut files = Vec::new();
    sources(src, &mut files);
    files.sort();
    let root: BTreeMap<&str, &str> = ROOT_ITEMS.iter().copied().collect();
    let mut out = Vec::new();
    // File-level edges, by module path.
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    let modules: BTreeSet<Vec<String>> = files
        .iter()
        .filter_map(|f| f.strip_prefix(src).ok())
        .map(module_path)
        .collect();
    for f in &files {
        let Ok(rel) = f.strip_prefix(src) else {
            continue;
        };
        let me = module_path(rel);
        if me.is_empty()
            || me == ["lib"]
            || me
                .last()
                .is_some_and(|l| l == "tests" || l.ends_with("_tests"))
        {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(f) else {
            out.push(format!("{}: unreadable", rel.display()));
            continue;
        };
        let top = &me[0];
        let Some(&my_tier) = tiers.get(top) else {
            out.push(format!(
                "{}: module `{top}` is not in the tier table of docs/architecture.md",
                rel.display()
            ));
            continue;
        };
        let (crate_paths, supers) = paths(&code_of(&text));
        for p in &crate_paths {
            let first = p[0].as_str();
            let target = root.get(first).copied().unwrap_or(first);
            match tiers.get(target) {
                None => out.push(format!(
                    "{}: `crate::{}` names no module of the tier table",
                    rel.display(),
                    p.join("::")
                )),
                Some(&t) if target != top && t >= my_tier => out.push(format!(
                    "{}: `{top}` (tier {my_tier}) imports `crate::{}` (tier {t}): \
                     a module may import only from lower tiers",
                    rel.display(),
                    p.join("::")
                )),
                _ => {}
            }
            // The longest prefix naming a source file is the edge's target.
            let target_file = (1..=p.len())
                .rev()
                .map(|k| p[..k].to_vec())
                .find(|m| modules.contains(m));
            if let Some(t) = target_file {
                if t != me {
                    edges.entry(me.clone()).or_default().insert(t);
                }
            }
        }
        // `super::x` from a file is its parent module's child x (or the
        // parent itself for a plain item).
        let is_mod_rs = rel.file_name().is_some_and(|n| n == "mod.rs");
        let parent: Vec<String> = if is_mod_rs {
            me[..me.len().saturating_sub(1)].to_vec()
        } else {
            me[..me.len() - 1].to_vec()
        };
        for s in &supers {
            let mut child = parent.clone();
            child.push(s.clone());
            let t = if modules.contains(&child) {
                child
            } else {
                parent.clone()
            };
            if t != me && !t.is_empty() {
                edges.entry(me.clone()).or_default().insert(t);
            }
        }
    }
    for (a, targets) in &edges {
        for b in targets {
            if a < b && edges.get(b).is_some_and(|bt| bt.contains(a)) {
                out.push(format!(
                    "`{}` and `{}` import each other",
                    a.join("::"),
                    b.join("::")
                ));
            }
        }
    }
    out
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_engine_follows_the_tier_table() {
    let doc = std::fs::read_to_string(crate_dir().join("../../docs/architecture.md"))
        .expect("docs/architecture.md");
    let tiers = read_tiers(&doc).unwrap();
    let v = violations(&crate_dir().join("src"), &tiers);
    assert!(v.is_empty(), "layering violations:\n{}", v.join("\n"));
}

#[test]
fn planted_violations_are_caught() {
    let doc = "<!-- tiers -->\n| tier | modules | what |\n|---|---|---|\n\
               | 0 | `error` | e |\n| 1 | `low`, `low2` | l |\n| 2 | `high`, `side` | h |\n<!-- /tiers -->";
    let tiers = read_tiers(doc).unwrap();
    assert_eq!(tiers.len(), 5);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path();
    let write = |rel: &str, text: &str| {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write(
        "lib.rs",
        "pub mod low; pub mod low2; pub mod high; pub mod side;",
    );
    write("low.rs", "use crate::{Error, Result};\npub fn f() {}\n");
    write(
        "high/mod.rs",
        "pub mod a;\npub mod b;\nuse crate::low::f;\n#[cfg(test)]\nmod tests { use crate::side::x; }\n",
    );
    write("high/a.rs", "use super::b::g;\n");
    write(
        "high/b.rs",
        "use crate::high::a::h;\n// use crate::side::comment;\n",
    );
    write("side.rs", "pub fn x() {}\n");
    write(
        "low2.rs",
        "#[cfg(test)]\nmod low2_tests;\n#[cfg(test)]\nfn helper() { let s = \"}\"; crate::high::a::h(); }\n\
         pub fn ok() {}\n",
    );
    // A clean tree: the cycle between high::a and high::b is the only finding.
    let v = violations(src, &tiers);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("high::a") && v[0].contains("import each other"),
        "{v:?}"
    );
    // Code after the test items is checked: an upward import there.
    write(
        "low2.rs",
        "#[cfg(test)]\nmod low2_tests;\npub fn ok() { crate::high::a::h(); }\n",
    );
    let v = violations(src, &tiers);
    assert!(
        v.iter()
            .any(|m| m.contains("low2.rs") && m.contains("tier 2")),
        "{v:?}"
    );
    write("low2.rs", "pub fn ok() {}\n");
    // An upward import.
    write("low.rs", "use crate::high::a;\n");
    let v = violations(src, &tiers);
    assert!(
        v.iter()
            .any(|m| m.contains("low.rs") && m.contains("tier 2")),
        "{v:?}"
    );
    // A sideways import inside one tier.
    write("side.rs", "pub fn x() { crate::high::a::h(); }\n");
    let v = violations(src, &tiers);
    assert!(
        v.iter()
            .any(|m| m.contains("side.rs") && m.contains("lower tiers")),
        "{v:?}"
    );
    // A module missing from the table.
    write("extra.rs", "pub fn y() {}\n");
    let v = violations(src, &tiers);
    assert!(
        v.iter()
            .any(|m| m.contains("`extra` is not in the tier table")),
        "{v:?}"
    );
}
