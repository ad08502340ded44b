//! The bench crate's modules form the layers drawn in `src/lib.rs` (module →
//! what it may use): every `crate::<module>` path in a module's source must
//! be listed in its row, and the listed graph must be acyclic, so an import
//! cycle (like the old report ↔ scenario ↔ worker ↔ workloads ↔
//! upager_engine circle) cannot come back.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    type Graph = BTreeMap<String, BTreeSet<String>>;

    fn src() -> &'static Path {
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))
    }

    /// The source without comments (doc links to higher layers are not uses)
    /// and without the text of string and char literals.
    fn strip(code: &str) -> String {
        let b = code.as_bytes();
        let mut out = String::with_capacity(code.len());
        let mut i = 0;
        while i < b.len() {
            if b[i..].starts_with(b"//") {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            } else if b[i..].starts_with(b"/*") {
                let mut depth = 0;
                while i < b.len() {
                    if b[i..].starts_with(b"/*") {
                        depth += 1;
                        i += 2;
                    } else if b[i..].starts_with(b"*/") {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            } else if b[i] == b'"' {
                // A raw string r"…"/r#"…"# holds no `"#` runs we care about;
                // skip to the closing quote, honouring escapes.
                let raw_hashes = raw_prefix(b, i);
                i += 1;
                while i < b.len() {
                    if raw_hashes.is_none() && b[i] == b'\\' {
                        i += 2;
                        continue;
                    }
                    if b[i] == b'"' {
                        let n = raw_hashes.unwrap_or(0);
                        if b[i + 1..].iter().take(n).all(|&c| c == b'#') {
                            i += 1 + n;
                            break;
                        }
                    }
                    i += 1;
                }
                out.push_str("\"\"");
            } else {
                let c = code[i..].chars().next().unwrap_or(' ');
                out.push(c);
                i += c.len_utf8();
            }
        }
        out
    }

    /// `Some(hashes)` if the quote at `i` opens a raw string `r#…"`.
    fn raw_prefix(b: &[u8], i: usize) -> Option<usize> {
        let mut j = i;
        let mut hashes = 0;
        while j > 0 && b[j - 1] == b'#' {
            hashes += 1;
            j -= 1;
        }
        (j > 0 && b[j - 1] == b'r' && (j < 2 || !is_ident(b[j - 2]))).then_some(hashes)
    }

    fn is_ident(c: u8) -> bool {
        c.is_ascii_alphanumeric() || c == b'_'
    }

    fn ident_at(s: &str) -> &str {
        let end = s.bytes().position(|c| !is_ident(c)).unwrap_or(s.len());
        &s[..end]
    }

    /// The first path segment of every `crate::` path: `crate::a::X`,
    /// `crate::{a, b::{c, d}}`.
    fn crate_uses(code: &str) -> BTreeSet<String> {
        let code = strip(code);
        let b = code.as_bytes();
        let mut out = BTreeSet::new();
        let mut from = 0;
        while let Some(p) = code[from..].find("crate::") {
            let at = from + p;
            from = at + "crate::".len();
            if at > 0 && (is_ident(b[at - 1]) || b[at - 1] == b'$') {
                continue;
            }
            let rest = code[from..].trim_start();
            if let Some(group) = rest.strip_prefix('{') {
                // Top-level items of the group.
                let mut depth = 0;
                let mut item_start = true;
                for (k, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => item_start = true,
                        c if item_start && !c.is_whitespace() => {
                            out.insert(ident_at(&group[k..]).to_string());
                            item_start = false;
                        }
                        _ => {}
                    }
                }
            } else {
                out.insert(ident_at(rest).to_string());
            }
        }
        out
    }

    /// The layer table of lib.rs: module → what it may use, in row order.
    fn documented() -> Vec<(String, BTreeSet<String>)> {
        let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
        lib.lines()
            .filter_map(|l| l.strip_prefix("//! | `"))
            .map(|row| {
                let cells: Vec<&str> = row.split(" | ").collect();
                let module = cells[0].trim_end_matches('`').to_string();
                let uses = cells
                    .last()
                    .unwrap()
                    .trim_end_matches('|')
                    .split(',')
                    .map(str::trim)
                    .filter(|u| !u.is_empty() && *u != "—")
                    .map(str::to_string)
                    .collect();
                (module, uses)
            })
            .collect()
    }

    /// Each module file's `crate::` uses (lib.rs, the facade, excluded).
    fn actual() -> Graph {
        let mut g = Graph::new();
        for e in std::fs::read_dir(src()).unwrap().flatten() {
            let p = e.path();
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            if p.extension().is_some_and(|x| x == "rs") && name != "lib" {
                let code = std::fs::read_to_string(&p).unwrap();
                let mut uses = crate_uses(&code);
                uses.remove(&name);
                g.insert(name, uses);
            }
        }
        g
    }

    /// A cycle of `g`, if it has one.
    fn find_cycle(g: &Graph) -> Option<Vec<String>> {
        fn visit(
            n: &str,
            g: &Graph,
            state: &mut BTreeMap<String, u8>,
            path: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            match state.get(n) {
                Some(1) => {
                    let i = path.iter().position(|x| x == n).unwrap_or(0);
                    let mut c = path[i..].to_vec();
                    c.push(n.to_string());
                    return Some(c);
                }
                Some(_) => return None,
                None => {}
            }
            state.insert(n.to_string(), 1);
            path.push(n.to_string());
            for m in g.get(n).into_iter().flatten() {
                if let Some(c) = visit(m, g, state, path) {
                    return Some(c);
                }
            }
            path.pop();
            state.insert(n.to_string(), 2);
            None
        }
        let mut state = BTreeMap::new();
        g.keys()
            .find_map(|n| visit(n, g, &mut state, &mut Vec::new()))
    }

    #[test]
    fn modules_form_the_documented_layers() {
        let doc = documented();
        let actual = actual();
        let doc_names: BTreeSet<String> = doc.iter().map(|(m, _)| m.clone()).collect();
        let file_names: BTreeSet<String> = actual.keys().cloned().collect();
        assert_eq!(
            doc_names, file_names,
            "the layer table in src/lib.rs must list every module file"
        );
        let mut above = BTreeSet::new();
        for (module, may_use) in &doc {
            for u in may_use {
                assert!(
                    above.contains(u),
                    "lib.rs table: {module} uses {u}, which is not in a row above it"
                );
            }
            let uses = &actual[module];
            for u in uses {
                assert!(
                    file_names.contains(u),
                    "{module}.rs uses crate::{u}: name the module that defines it \
                     (going through the crate root's re-exports hides the edge)"
                );
                assert!(
                    may_use.contains(u),
                    "{module}.rs uses crate::{u}, which the layer table in src/lib.rs \
                     does not allow (allowed: {may_use:?})"
                );
            }
            for u in may_use {
                assert!(
                    uses.contains(u),
                    "lib.rs table: {module} is listed as using {u}, but {module}.rs does not: \
                     keep the table exact"
                );
            }
            above.insert(module.clone());
        }
        assert_eq!(find_cycle(&actual), None, "import cycle");
    }

    #[test]
    fn parser_and_cycle_finder() {
        let code = r#"
            use crate::a::{X, Y};
            use crate::{b, c::{self, Z}, d::W};
            // use crate::commented;
            /// [`crate::doclink`]
            let s = "crate::in_string";
            let r = r"crate::in_raw";
            fn f() { crate::e::g(); $crate::macro_path; }
        "#;
        let got: Vec<String> = crate_uses(code).into_iter().collect();
        assert_eq!(got, ["a", "b", "c", "d", "e"]);

        let g = |edges: &[(&str, &str)]| {
            let mut g = Graph::new();
            for (a, b) in edges {
                g.entry(a.to_string()).or_default().insert(b.to_string());
                g.entry(b.to_string()).or_default();
            }
            g
        };
        assert_eq!(find_cycle(&g(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
        let c = find_cycle(&g(&[
            ("report", "scenario"),
            ("scenario", "worker"),
            ("worker", "report"),
        ]))
        .unwrap();
        assert_eq!(c.first(), c.last());
        assert_eq!(c.len(), 4, "{c:?}");
    }
}
